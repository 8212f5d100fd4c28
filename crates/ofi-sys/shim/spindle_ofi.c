/*
 * spindle-ofi-sys: the C side of Spindle's libfabric bindings.
 *
 * libfabric's data-path calls (fi_write, fi_cq_read, fi_mr_reg,
 * fi_endpoint, fi_close, ...) are `static inline` functions in the headers
 * that call through per-object operation tables; they are not symbols of
 * libfabric.so, so Rust cannot link to them. This file compiles them into
 * real functions (prefix `spof_`) and keeps the structures whose layout
 * changes between libfabric releases (struct fi_info and its attributes)
 * on the C side: Rust sees opaque handles and plain integers only.
 *
 * Every function returns 0 or a positive count on success and a negative
 * libfabric error code (-FI_E...) on failure, as libfabric does.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* The API version Spindle is written against; later libraries accept it. */
#define SPOF_FI_VERSION FI_VERSION(1, 10)

/* The endpoint flags Spindle's fabric reports (spof_flags). */
#define SPOF_ORDERED_WAW 1u  /* RMA writes to one peer land in issue order */
#define SPOF_WAITABLE 2u     /* the CQ has a wait object (spof_cq_sread blocks) */
#define SPOF_MR_VIRT_ADDR 4u /* remote addresses are virtual addresses (FI_MR_VIRT_ADDR) */
#define SPOF_MR_LOCAL 8u     /* local buffers need their descriptor (FI_MR_LOCAL) */
#define SPOF_MR_PROV_KEY 16u /* the provider picks keys (FI_MR_PROV_KEY) */
#define SPOF_DELIVERY_COMPLETE 32u /* a write completes once it is in the target's memory (FI_DELIVERY_COMPLETE) */
#define SPOF_MSG 64u /* the endpoint also sends and receives messages (FI_MSG) */

/* spof_open's `open_flags`. */
#define SPOF_OPEN_DELIVERY_COMPLETE 1 /* every write completes once delivered */
#define SPOF_OPEN_MSG 2               /* FI_MSG too: fi_send / fi_recv (the RPC baseline) */

struct spof_endpoint {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    uint32_t flags;
};

static void spof_err(char *err, size_t err_len, const char *what, int ret)
{
    if (err && err_len)
        snprintf(err, err_len, "%s: %s (%d)", what, fi_strerror(ret < 0 ? -ret : ret), ret);
}

const char *spof_strerror(int code)
{
    return fi_strerror(code < 0 ? -code : code);
}

static struct fi_info *spof_hints(const char *provider, int ordered, int msg)
{
    struct fi_info *hints = fi_allocinfo();
    if (!hints)
        return NULL;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
    if (msg)
        hints->caps |= FI_MSG | FI_SEND | FI_RECV;
    /* The modes Spindle supports: none that need per-operation contexts. */
    hints->mode = 0;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    if (ordered) {
        hints->tx_attr->msg_order = FI_ORDER_WAW | FI_ORDER_RMA_WAW;
        hints->rx_attr->msg_order = FI_ORDER_WAW | FI_ORDER_RMA_WAW;
    }
    if (provider && provider[0]) {
        hints->fabric_attr->prov_name = strdup(provider);
        if (!hints->fabric_attr->prov_name) {
            fi_freeinfo(hints);
            return NULL;
        }
    }
    return hints;
}

/*
 * Write the names of the providers that offer RDM endpoints with RMA
 * writes, comma-separated and each once, into `buf` (NUL-terminated,
 * truncated to `buf_len`). Returns how many were found, or a negative code.
 */
int spof_providers(char *buf, size_t buf_len)
{
    struct fi_info *hints = spof_hints(NULL, 0, 0);
    struct fi_info *list = NULL, *cur;
    size_t used = 0;
    int found = 0, ret;
    if (!hints)
        return -FI_ENOMEM;
    ret = fi_getinfo(SPOF_FI_VERSION, NULL, NULL, 0, hints, &list);
    fi_freeinfo(hints);
    if (buf_len)
        buf[0] = '\0';
    if (ret == -FI_ENODATA)
        return 0;
    if (ret)
        return ret;
    for (cur = list; cur; cur = cur->next) {
        const char *name = cur->fabric_attr->prov_name;
        size_t len = strlen(name);
        const char *seen = buf;
        int dup = 0;
        while (used && seen && *seen) {
            if (!strncmp(seen, name, len) && (seen[len] == ',' || seen[len] == '\0')) {
                dup = 1;
                break;
            }
            seen = strchr(seen, ',');
            if (seen)
                seen++;
        }
        if (dup)
            continue;
        if (used + len + 2 > buf_len)
            break;
        if (used)
            buf[used++] = ',';
        memcpy(buf + used, name, len);
        used += len;
        buf[used] = '\0';
        found++;
    }
    fi_freeinfo(list);
    return found;
}

void spof_close(struct spof_endpoint *e)
{
    if (!e)
        return;
    /* Children before parents: the endpoint holds the CQ and AV. */
    if (e->ep)
        fi_close(&e->ep->fid);
    if (e->av)
        fi_close(&e->av->fid);
    if (e->cq)
        fi_close(&e->cq->fid);
    if (e->domain)
        fi_close(&e->domain->fid);
    if (e->fabric)
        fi_close(&e->fabric->fid);
    if (e->info)
        fi_freeinfo(e->info);
    free(e);
}

static int spof_open_cq(struct spof_endpoint *e, size_t cq_depth)
{
    struct fi_cq_attr attr;
    int ret;
    memset(&attr, 0, sizeof attr);
    attr.format = FI_CQ_FORMAT_CONTEXT;
    attr.size = cq_depth;
    attr.wait_obj = FI_WAIT_UNSPEC;
    ret = fi_cq_open(e->domain, &attr, &e->cq, NULL);
    if (ret == 0) {
        e->flags |= SPOF_WAITABLE;
        return 0;
    }
    attr.wait_obj = FI_WAIT_NONE;
    return fi_cq_open(e->domain, &attr, &e->cq, NULL);
}

/*
 * Open an RDM endpoint of `provider` for RMA writes: fabric, domain, a
 * completion queue of `cq_depth` entries, an address vector and the
 * endpoint, enabled. Asks for write-after-write ordering first and falls
 * back to an unordered endpoint (then SPOF_ORDERED_WAW is clear and the
 * caller must order writes itself); `trust_order` 0 skips the ordered
 * attempt (for a provider known to break its ordering claim). An
 * unordered endpoint's writes complete only once delivered
 * (FI_DELIVERY_COMPLETE), so that the caller can order by completions.
 * `open_flags`: SPOF_OPEN_DELIVERY_COMPLETE asks for delivery completion
 * on every endpoint (a completion then says the bytes are in the target's
 * memory, not only sent: the replica's acknowledgement); SPOF_OPEN_MSG
 * adds messages (fi_send / fi_recv). On failure `err` says which step.
 */
int spof_open(const char *provider, int trust_order, int open_flags, size_t cq_depth, struct spof_endpoint **out,
              char *err, size_t err_len)
{
    struct spof_endpoint *e = calloc(1, sizeof *e);
    struct fi_info *hints;
    struct fi_av_attr av_attr;
    int ret, ordered;
    *out = NULL;
    if (!e)
        return -FI_ENOMEM;
    for (ordered = trust_order ? 1 : 0; ordered >= 0; ordered--) {
        hints = spof_hints(provider, ordered, open_flags & SPOF_OPEN_MSG);
        if (!hints) {
            free(e);
            return -FI_ENOMEM;
        }
        ret = fi_getinfo(SPOF_FI_VERSION, NULL, NULL, 0, hints, &e->info);
        fi_freeinfo(hints);
        if (ret == 0)
            break;
    }
    if (ret) {
        spof_err(err, err_len, "fi_getinfo (RDM endpoint with RMA writes)", ret);
        free(e);
        return ret;
    }
    if (ordered == 1)
        e->flags |= SPOF_ORDERED_WAW;
    if (open_flags & SPOF_OPEN_MSG)
        e->flags |= SPOF_MSG;
    if (ordered != 1 || (open_flags & SPOF_OPEN_DELIVERY_COMPLETE)) {
        e->info->tx_attr->op_flags |= FI_DELIVERY_COMPLETE;
        e->flags |= SPOF_DELIVERY_COMPLETE;
    }
    /* FI_MR_BASIC (the old name of the three modes together) counts too. */
    if (e->info->domain_attr->mr_mode & (FI_MR_VIRT_ADDR | FI_MR_BASIC))
        e->flags |= SPOF_MR_VIRT_ADDR;
    if (e->info->domain_attr->mr_mode & FI_MR_LOCAL)
        e->flags |= SPOF_MR_LOCAL;
    if (e->info->domain_attr->mr_mode & (FI_MR_PROV_KEY | FI_MR_BASIC))
        e->flags |= SPOF_MR_PROV_KEY;
    ret = fi_fabric(e->info->fabric_attr, &e->fabric, NULL);
    if (ret) {
        spof_err(err, err_len, "fi_fabric", ret);
        goto fail;
    }
    ret = fi_domain(e->fabric, e->info, &e->domain, NULL);
    if (ret) {
        spof_err(err, err_len, "fi_domain", ret);
        goto fail;
    }
    ret = spof_open_cq(e, cq_depth);
    if (ret) {
        spof_err(err, err_len, "fi_cq_open", ret);
        goto fail;
    }
    memset(&av_attr, 0, sizeof av_attr);
    av_attr.type = FI_AV_TABLE;
    ret = fi_av_open(e->domain, &av_attr, &e->av, NULL);
    if (ret) {
        spof_err(err, err_len, "fi_av_open", ret);
        goto fail;
    }
    ret = fi_endpoint(e->domain, e->info, &e->ep, NULL);
    if (ret) {
        spof_err(err, err_len, "fi_endpoint", ret);
        goto fail;
    }
    ret = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret) {
        spof_err(err, err_len, "fi_ep_bind (completion queue)", ret);
        goto fail;
    }
    ret = fi_ep_bind(e->ep, &e->av->fid, 0);
    if (ret) {
        spof_err(err, err_len, "fi_ep_bind (address vector)", ret);
        goto fail;
    }
    ret = fi_enable(e->ep);
    if (ret) {
        spof_err(err, err_len, "fi_enable", ret);
        goto fail;
    }
    *out = e;
    return 0;
fail:
    spof_close(e);
    return ret;
}

uint32_t spof_flags(const struct spof_endpoint *e)
{
    return e->flags;
}

/* Largest single RMA write. */
uint64_t spof_max_msg_size(const struct spof_endpoint *e)
{
    return (uint64_t)e->info->ep_attr->max_msg_size;
}

/* "provider fabric domain" into buf (NUL-terminated, truncated). */
void spof_describe(const struct spof_endpoint *e, char *buf, size_t buf_len)
{
    snprintf(buf, buf_len, "%s %s %s", e->info->fabric_attr->prov_name, e->info->fabric_attr->name,
             e->info->domain_attr->name);
}

/* The endpoint's address; *len is the buffer's size in, the address's out. */
int spof_getname(struct spof_endpoint *e, void *addr, size_t *len)
{
    return fi_getname(&e->ep->fid, addr, len);
}

int spof_av_insert(struct spof_endpoint *e, const void *addr, uint64_t *fi_addr)
{
    fi_addr_t a = FI_ADDR_UNSPEC;
    int ret = fi_av_insert(e->av, addr, 1, &a, 0, NULL);
    *fi_addr = (uint64_t)a;
    if (ret == 1)
        return 0;
    return ret < 0 ? ret : -FI_EINVAL;
}

int spof_av_remove(struct spof_endpoint *e, uint64_t fi_addr)
{
    fi_addr_t a = (fi_addr_t)fi_addr;
    return fi_av_remove(e->av, &a, 1, 0);
}

/*
 * Register `len` bytes at `buf` for local writes and remote writes.
 * `requested_key` is used when the provider does not pick keys.
 */
int spof_mr_reg(struct spof_endpoint *e, void *buf, size_t len, uint64_t requested_key, struct fid_mr **mr,
                uint64_t *key, void **desc)
{
    uint64_t access = FI_WRITE | FI_REMOTE_WRITE;
    int ret;
    if (e->flags & SPOF_MSG)
        access |= FI_SEND | FI_RECV;
    ret = fi_mr_reg(e->domain, buf, len, access, 0, requested_key, 0, mr, NULL);
    if (ret)
        return ret;
    *key = fi_mr_key(*mr);
    *desc = fi_mr_desc(*mr);
    return 0;
}

void spof_mr_close(struct fid_mr *mr)
{
    if (mr)
        fi_close(&mr->fid);
}

/* One RMA write; `context` comes back in its completion. */
ssize_t spof_write(struct spof_endpoint *e, const void *buf, size_t len, void *desc, uint64_t dest,
                   uint64_t addr, uint64_t key, void *context)
{
    return fi_write(e->ep, buf, len, desc, (fi_addr_t)dest, addr, key, context);
}

/* One message of `len` bytes at `buf` to `dest` (needs SPOF_MSG). */
ssize_t spof_send(struct spof_endpoint *e, const void *buf, size_t len, void *desc, uint64_t dest, void *context)
{
    return fi_send(e->ep, buf, len, desc, (fi_addr_t)dest, context);
}

/* Post a receive buffer of `len` bytes at `buf`, from any peer (needs SPOF_MSG). */
ssize_t spof_recv(struct spof_endpoint *e, void *buf, size_t len, void *desc, void *context)
{
    return fi_recv(e->ep, buf, len, desc, FI_ADDR_UNSPEC, context);
}

/* Up to `count` completions' contexts into `contexts`; -FI_EAGAIN if none. */
ssize_t spof_cq_read(struct spof_endpoint *e, void **contexts, size_t count)
{
    struct fi_cq_entry entries[64];
    ssize_t n, i;
    if (count > 64)
        count = 64;
    n = fi_cq_read(e->cq, entries, count);
    for (i = 0; i < n; i++)
        contexts[i] = entries[i].op_context;
    return n;
}

/* As spof_cq_read, blocking up to `timeout_ms` (needs SPOF_WAITABLE). */
ssize_t spof_cq_sread(struct spof_endpoint *e, void **contexts, size_t count, int timeout_ms)
{
    struct fi_cq_entry entries[64];
    ssize_t n, i;
    if (count > 64)
        count = 64;
    n = fi_cq_sread(e->cq, entries, count, NULL, timeout_ms);
    for (i = 0; i < n; i++)
        contexts[i] = entries[i].op_context;
    return n;
}

/*
 * The error completion at the head of the CQ (after spof_cq_read returned
 * -FI_EAVAIL): its context, error code and the provider's text.
 */
int spof_cq_readerr(struct spof_endpoint *e, void **context, int *code, char *buf, size_t buf_len)
{
    struct fi_cq_err_entry entry;
    ssize_t ret;
    memset(&entry, 0, sizeof entry);
    ret = fi_cq_readerr(e->cq, &entry, 0);
    if (ret < 0)
        return (int)ret;
    *context = entry.op_context;
    *code = entry.err;
    snprintf(buf, buf_len, "%s (%s)", fi_strerror(entry.err),
             fi_cq_strerror(e->cq, entry.prov_errno, entry.err_data, NULL, 0));
    return 0;
}
