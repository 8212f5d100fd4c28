//! Optional TLS for the tcp fabric ([`super::TcpOptions::tls`]), with
//! rustls: mutual authentication against the group's own CA, then the
//! group-key [`super::handshake`] and every frame inside the TLS session.
//!
//! - Every member presents a certificate signed by the group's CA
//!   (`tls_ca`) and checks its peer's against it, both ways: the dialer
//!   as a client that checks the listener's certificate for the IP
//!   address it dialed (the certificate needs that address as an IP
//!   subject alternative name), the listener as a server that requires a
//!   client certificate. A peer with a certificate from another CA is
//!   refused in the TLS handshake, before the group key is even checked.
//! - After the TLS handshake, the group-key handshake runs as without TLS,
//!   inside the session; then frames flow in TLS records.
//! - Sending encrypts into a per-peer buffer under the session lock and
//!   sends after releasing it; receiving decrypts under the lock. One
//!   session per connection is shared by its writer (the pushing thread)
//!   and its reader (the receive thread or a parked loop): the lock is
//!   never held across a blocking system call, so the receive path never
//!   waits on a full socket.
//!
//! TLS costs a copy and an encryption per byte on each side, and the
//! zero-copy send (frames gathered straight from the row) is lost.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::FabricError;

/// PEM text of a member's certificate chain, its private key, and the
/// group CA's certificate(s).
#[derive(Clone)]
pub struct TlsConfig {
    pub cert_chain_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Read the three PEM files (`tls_cert`, `tls_key`, `tls_ca`).
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> Result<TlsConfig, FabricError> {
        let read = |what: &str, p: &Path| {
            std::fs::read(p).map_err(|e| FabricError::io(format!("read the TLS {what} file {}", p.display()), e))
        };
        Ok(TlsConfig {
            cert_chain_pem: read("certificate", cert)?,
            key_pem: read("key", key)?,
            ca_pem: read("CA certificate", ca)?,
        })
    }
}

/// The client and server configurations of one member.
pub struct TlsContext {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

impl TlsContext {
    pub fn new(config: &TlsConfig) -> Result<TlsContext, FabricError> {
        let bad = |what: String| FabricError::InvalidOption(format!("TLS: {what}"));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&config.cert_chain_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| bad(format!("the certificate (tls_cert) is not valid PEM: {e}")))?;
        if certs.is_empty() {
            return Err(bad("the certificate file (tls_cert) holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&config.key_pem)
            .map_err(|e| bad(format!("the private key (tls_key) is not a valid PEM key: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        let mut cas = 0;
        for ca in CertificateDer::pem_slice_iter(&config.ca_pem) {
            let ca = ca.map_err(|e| bad(format!("the CA file (tls_ca) is not valid PEM: {e}")))?;
            roots
                .add(ca)
                .map_err(|e| bad(format!("the CA certificate (tls_ca) is not usable: {e}")))?;
            cas += 1;
        }
        if cas == 0 {
            return Err(bad("the CA file (tls_ca) holds no certificate".into()));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(certs.clone(), key.clone_key())
            .map_err(|e| bad(format!("certificate and key (tls_cert, tls_key) do not match: {e}")))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| bad(format!("certificate and key (tls_cert, tls_key) do not match: {e}")))?;
        server.send_tls13_tickets = 0;
        Ok(TlsContext {
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// A server session for an accepted connection, driven without
    /// blocking by the acceptor (`accept`).
    pub fn server_connection(&self) -> Result<rustls::Connection, String> {
        let mut conn: rustls::Connection = rustls::ServerConnection::new(self.server.clone())
            .map_err(|e| format!("TLS: {e}"))?
            .into();
        // Encrypted records go out whole from the send buffer (see `seal`);
        // plaintext written during the TLS handshake waits in the session.
        conn.set_buffer_limit(None);
        Ok(conn)
    }

    /// Run the TLS handshake on a blocking `stream` (its timeouts bound
    /// it): as the client checking the certificate for `dialed` when set,
    /// else as the server. The error says what failed.
    pub fn handshake(&self, stream: &TcpStream, dialed: Option<IpAddr>) -> Result<rustls::Connection, String> {
        let mut conn: rustls::Connection = match dialed {
            Some(ip) => rustls::ClientConnection::new(self.client.clone(), ServerName::IpAddress(ip.into()))
                .map_err(|e| format!("TLS: {e}"))?
                .into(),
            None => rustls::ServerConnection::new(self.server.clone())
                .map_err(|e| format!("TLS: {e}"))?
                .into(),
        };
        // Encrypted records go out whole from the send buffer (see `seal`).
        conn.set_buffer_limit(None);
        let mut s = stream;
        let mut rounds = 0;
        while conn.is_handshaking() {
            rounds += 1;
            if rounds > HANDSHAKE_ROUNDS_MAX {
                return Err("TLS: the handshake did not finish".into());
            }
            conn.complete_io(&mut s).map_err(|e| {
                format!(
                    "TLS handshake failed: {e} (are both members' certificates signed by the same group CA, tls_ca?)"
                )
            })?;
        }
        while conn.wants_write() {
            conn.write_tls(&mut s).map_err(|e| format!("TLS: {e}"))?;
        }
        Ok(conn)
    }
}

/// Bound on handshake I/O rounds (each blocks at most the socket timeout).
const HANDSHAKE_ROUNDS_MAX: usize = 64;
/// Ciphertext read from the socket at once (a TLS record is at most
/// about 16.6 KiB).
const CIPHERTEXT_CHUNK: usize = 32 << 10;

/// One connection's TLS session, shared by its writer and its reader.
pub type Session = Arc<Mutex<rustls::Connection>>;

/// Encrypt `plain` (a gather list) into `out` under the session lock.
pub fn seal(session: &Session, plain: &[&[u8]], out: &mut Vec<u8>) -> io::Result<()> {
    let mut conn = session.lock().unwrap_or_else(|p| p.into_inner());
    for part in plain {
        conn.writer().write_all(part)?;
    }
    out.clear();
    while conn.wants_write() {
        conn.write_tls(out)?;
    }
    Ok(())
}

/// A reader's TLS state: the session and ciphertext read but not yet fed.
pub struct TlsReader {
    pub session: Session,
    inbuf: Box<[u8]>,
    lo: usize,
    hi: usize,
}

impl TlsReader {
    pub fn new(session: Session) -> TlsReader {
        TlsReader {
            session,
            inbuf: vec![0u8; CIPHERTEXT_CHUNK].into_boxed_slice(),
            lo: 0,
            hi: 0,
        }
    }

    /// Decrypted bytes into `dst`: `Ok(0)` at the end of the stream,
    /// `WouldBlock` when nothing is there. `recv` reads ciphertext from the
    /// socket without blocking. Returns short only once nothing is left
    /// inside the session or the ciphertext buffer (so a socket that
    /// `poll` calls empty holds nothing undelivered).
    pub fn read(&mut self, dst: &mut [u8], mut recv: impl FnMut(&mut [u8]) -> io::Result<usize>) -> io::Result<usize> {
        let mut conn = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let mut got = 0;
        // Bounded: every round moves plaintext out, ciphertext in, or
        // returns.
        for _ in 0..4 * (dst.len() / 1024 + CIPHERTEXT_CHUNK / 512 + 4) {
            if got == dst.len() {
                return Ok(got);
            }
            match conn.reader().read(&mut dst[got..]) {
                Ok(0) => return Ok(got), // close_notify: the end of the stream
                Ok(n) => {
                    got += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self.lo < self.hi {
                let mut pending = &self.inbuf[self.lo..self.hi];
                let n = conn.read_tls(&mut pending)?;
                self.lo += n;
                conn.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
                continue;
            }
            if got > 0 {
                return Ok(got);
            }
            let n = recv(&mut self.inbuf)?;
            if n == 0 {
                return Ok(0);
            }
            (self.lo, self.hi) = (0, n);
        }
        if got > 0 {
            Ok(got)
        } else {
            Err(io::Error::new(io::ErrorKind::WouldBlock, "TLS: no progress"))
        }
    }
}

/// Read and write through a TLS session on a blocking stream (the
/// group-key handshake inside TLS).
pub struct TlsIo<'a> {
    pub conn: &'a mut rustls::Connection,
    pub stream: &'a TcpStream,
}

impl Read for TlsIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.stream;
        // Bounded: each round reads from the socket (bounded by its
        // timeout) or returns.
        for _ in 0..HANDSHAKE_ROUNDS_MAX {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            self.flush()?;
            if self.conn.read_tls(&mut s)? == 0 {
                return Ok(0);
            }
            self.conn
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "TLS: no data"))
    }
}

impl Write for TlsIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.conn.writer().write(buf)?;
        self.flush()?;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        let mut s = self.stream;
        while self.conn.wants_write() {
            self.conn.write_tls(&mut s)?;
        }
        Ok(())
    }
}
