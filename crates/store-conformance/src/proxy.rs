//! A TCP proxy in front of a real server that can go silent: while silent,
//! it reads what either side sends and forwards nothing (a network that
//! black-holes: the server never hears the query, the client never the
//! answer), without closing anything. Shared by the store's tests and the
//! CLI's (a test fixture: it panics when it cannot set itself up).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Proxy {
    pub port: u16,
    silent: Arc<AtomicBool>,
}

impl Proxy {
    pub fn to(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = Arc::new(AtomicBool::new(false));
        let quiet = silent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let quiet = quiet.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => {
                                    let _ = to.shutdown(std::net::Shutdown::Write);
                                    return;
                                }
                                Ok(n) => n,
                            };
                            if !quiet.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Proxy { port, silent }
    }

    /// A PostgreSQL URL `url` with its host and port replaced by a proxy's
    /// (started to that host and port), and the proxy.
    pub fn for_postgres(url: &str) -> (Proxy, String) {
        let (head, rest) = url.split_once('@').unwrap();
        let slash = rest.find('/').unwrap();
        let upstream: SocketAddr = rest[..slash]
            .replace("localhost", "127.0.0.1")
            .parse()
            .unwrap();
        let proxy = Proxy::to(upstream);
        let proxied = format!("{head}@127.0.0.1:{}{}", proxy.port, &rest[slash..]);
        (proxy, proxied)
    }

    pub fn go_silent(&self, yes: bool) {
        self.silent.store(yes, Ordering::SeqCst);
    }
}
