//! The tcp fabric inside TLS: members whose certificates come from the
//! group's CA (made here, in the test) connect, run the group-key
//! handshake inside TLS and exchange rows, also for a member that joins
//! late; a member with a certificate from another CA is refused on both
//! sides with an error naming the TLS fault. Loopback only; bounded waits;
//! every fabric is closed at the end of its test.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use spindle_fabric::tcp::tls::TlsConfig;
use spindle_fabric::tcp::{TcpFabric, TcpOptions};
use spindle_fabric::{Fabric, PeerSet};

mod common;
use common::{listeners, open_together, publish, sees, wait_until};

const ROW: usize = 4096;

/// A self-signed CA.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-sign the CA");
        Ca { cert, key }
    }

    /// A member certificate for 127.0.0.1 signed by this CA, with this
    /// CA as the trust root.
    fn member(&self, trust: &Ca) -> TlsConfig {
        let key = KeyPair::generate().expect("member key");
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("member params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("sign");
        TlsConfig {
            cert_chain_pem: cert.pem().into_bytes(),
            key_pem: key.serialize_pem().into_bytes(),
            ca_pem: trust.cert.pem().into_bytes(),
        }
    }
}

fn options(group: &str, addrs: &[SocketAddr], tls: TlsConfig) -> TcpOptions {
    let mut o = TcpOptions::new(group, ROW, 7, addrs.to_vec(), b"tls group key".to_vec());
    o.join_timeout = Duration::from_secs(5);
    o.tls = Some(tls);
    o
}

#[test]
fn members_with_certificates_of_the_group_ca_connect_and_exchange_rows_over_tls() {
    let ca = Ca::new("spindle test group CA");
    let (mut ls, addrs) = listeners(3);
    let opts: Vec<TcpOptions> = (0..3)
        .map(|r| {
            let mut o = options("tls-group", &addrs, ca.member(&ca));
            if r < 2 {
                o.wait_for = Some(PeerSet(0b011));
            }
            o
        })
        .collect();
    let mut fs = open_together(&mut ls, 0..2, |r| &opts[r])
        .into_iter()
        .map(|r| r.expect("open"));
    let (f0, f1) = (fs.next().expect("member 0"), fs.next().expect("member 1"));
    // Many pushes, small and large (one push spans several TLS records).
    for i in 1..=200u64 {
        publish(&f0, (i % 16) as usize, i);
    }
    let big: Vec<u64> = (0..(ROW / 8) as u64).map(|w| w * 3 + 1).collect();
    for (w, v) in big.iter().enumerate().skip(16) {
        f1.row(1).u64_at(w * 8).store(*v, Ordering::Relaxed);
    }
    f1.push(128..ROW, PeerSet(0b001)).expect("push a large range");
    publish(&f1, 0, 99);
    wait_until("member 1 to see member 0's last push", || sees(&f1, 0, 200 % 16, 200));
    wait_until("member 0 to see member 1's guard", || sees(&f0, 1, 0, 99));
    for (w, v) in big.iter().enumerate().skip(16) {
        assert_eq!(f0.row(1).u64_at(w * 8).load(Ordering::Relaxed), *v, "word {w}");
    }
    // A late member over TLS too (the link threads' handshakes).
    let f2 = TcpFabric::open_with_listener(&opts[2], 2, ls[2].take().expect("l2")).expect("open 2");
    wait_until("members 0 and 1 to see member 2", || {
        f0.joined() == PeerSet(0b111) && f1.joined() == PeerSet(0b111)
    });
    publish(&f2, 3, 33);
    wait_until("member 2's push over TLS", || {
        sees(&f0, 2, 3, 33) && sees(&f1, 2, 3, 33)
    });
    assert!(f0.describe().starts_with("tcp:tls-group"));
}

#[test]
fn a_member_with_a_certificate_from_another_ca_is_refused_with_a_clear_error() {
    let ca = Ca::new("the group's CA");
    let other = Ca::new("some other CA");
    let (mut ls, addrs) = listeners(2);
    let o0 = options("tls-refuse", &addrs, ca.member(&ca));
    // Member 1's certificate is from another CA (it trusts the group CA).
    let o1 = options("tls-refuse", &addrs, other.member(&ca));
    let mut rs = open_together(&mut ls, 0..2, |r| if r == 0 { &o0 } else { &o1 }).into_iter();
    let (r0, r1) = (rs.next().expect("member 0"), rs.next().expect("member 1"));
    let e0 = r0.err().expect("member 0 must refuse member 1").to_string();
    let e1 = r1.err().expect("member 1 must be refused").to_string();
    assert!(e0.contains("TLS handshake failed"), "member 0 said: {e0}");
    assert!(e0.contains("certificate"), "member 0 said: {e0}");
    assert!(e1.contains("TLS handshake failed"), "member 1 said: {e1}");
}

#[test]
fn bad_tls_files_are_named() {
    let ca = Ca::new("the group's CA");
    let mut tls = ca.member(&ca);
    tls.key_pem = b"not a key".to_vec();
    let (mut ls, addrs) = listeners(1);
    let e = TcpFabric::open_with_listener(&options("tls-bad", &addrs, tls), 0, ls[0].take().expect("l0"))
        .err()
        .expect("a bad key is refused")
        .to_string();
    assert!(e.contains("tls_key"), "{e}");
}

/// With TLS on, the TLS handshake of every accepted connection runs inside
/// its own deadline and beside the others: random bytes, an HTTP GET and a
/// silent connection at a forming member fail alone, counted, and the
/// members' TLS handshakes complete.
#[test]
fn strangers_do_not_disturb_tls_handshakes_while_the_group_forms() {
    use std::io::Write;
    use std::net::TcpStream;
    let ca = Ca::new("the group's CA");
    let (mut ls, addrs) = listeners(3);
    let mut o = options("tls-strangers", &addrs, ca.member(&ca));
    o.handshake_timeout = Duration::from_millis(500);
    o.join_timeout = Duration::from_secs(15);
    let connect = |a: SocketAddr| TcpStream::connect_timeout(&a, Duration::from_secs(5)).expect("connect");
    let mut held = Vec::new();
    for a in &addrs[..2] {
        let mut random = connect(*a);
        random
            .write_all(&[0x16, 0x03, 0x01, 0x00, 0x7b])
            .expect("a TLS record header");
        random.write_all(&[0x5a; 123]).expect("then noise");
        let mut http = connect(*a);
        http.write_all(b"GET / HTTP/1.1\r\nHost: member\r\n\r\n")
            .expect("an HTTP GET");
        held.extend([random, http, connect(*a)]);
    }
    let fs: Vec<TcpFabric> = open_together(&mut ls, 0..3, |_| &o)
        .into_iter()
        .enumerate()
        .map(|(r, f)| f.unwrap_or_else(|e| panic!("member {r} failed to open despite the strangers: {e}")))
        .collect();
    for f in &fs[..2] {
        wait_until("the strangers to be counted", || f.handshake_stats().failed >= 3);
    }
    publish(&fs[2], 1, 5);
    wait_until("member 2's push over TLS", || {
        sees(&fs[0], 2, 1, 5) && sees(&fs[1], 2, 1, 5)
    });
    drop(held);
}
