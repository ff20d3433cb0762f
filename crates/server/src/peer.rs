//! Who holds the other end of a loopback TCP connection (issue 24: "a token
//! is the operator's only when it comes from outside every agent").
//!
//! A bearer token proves knowledge, not identity: an agent with `network:
//! all` that got hold of the token (from a careless environment, a log)
//! could otherwise act as the operator. The listener only takes loopback
//! connections, so the client's socket is on this host, in this network
//! namespace: `/proc/net/tcp` and `/proc/net/tcp6` (proc(5)) give its inode
//! and owner, and the `/proc/<pid>/fd` links that name that inode give the
//! processes holding it. Each of them is then identified like a caller on
//! the control socket; the token counts only if every one is the operator.

use std::net::{IpAddr, SocketAddr};

/// The processes holding the client end of the TCP connection from `peer` to
/// `local`, and the uid that owns that socket; `Err` says why they could not
/// be found (the client already gone, or a process this one may not look at).
pub(crate) fn holders(peer: SocketAddr, local: SocketAddr) -> Result<(Vec<i32>, u32), String> {
    let (inode, uid) = socket_of(peer, local)?;
    let link = format!("socket:[{inode}]");
    let mut pids = Vec::new();
    let procs = std::fs::read_dir("/proc").map_err(|e| format!("reading /proc: {e}"))?;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == link.as_str()))
        {
            pids.push(pid);
        }
    }
    if pids.is_empty() {
        return Err(format!(
            "no process holds the client's socket (inode {inode}) any more"
        ));
    }
    Ok((pids, uid))
}

/// The inode and owner of the socket whose local address is `peer` and whose
/// remote address is `local` (the client's side of our connection).
fn socket_of(peer: SocketAddr, local: SocketAddr) -> Result<(u64, u32), String> {
    let table = match peer.ip() {
        IpAddr::V4(_) => "/proc/net/tcp",
        IpAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table).map_err(|e| format!("reading {table}: {e}"))?;
    find(&text, peer, local).ok_or_else(|| format!("the client's socket {peer} is not in {table}"))
}

/// The line of a `/proc/net/tcp{,6}` table for the socket `here` -> `there`:
/// its inode and uid.
fn find(text: &str, here: SocketAddr, there: SocketAddr) -> Option<(u64, u32)> {
    let (h, t) = (hex_addr(here), hex_addr(there));
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st queues timer retr uid timeout inode ...
        if f.len() < 10 || !f[1].eq_ignore_ascii_case(&h) || !f[2].eq_ignore_ascii_case(&t) {
            return None;
        }
        Some((f[9].parse().ok()?, f[7].parse().ok()?))
    })
}

/// An address as the tables print it: the address's 32-bit words in host
/// byte order, each as eight hex digits, then `:` and the port in hex.
fn hex_addr(a: SocketAddr) -> String {
    let words: Vec<u32> = match a.ip() {
        IpAddr::V4(v4) => vec![u32::from_ne_bytes(v4.octets())],
        IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    let mut s: String = words.iter().map(|w| format!("{w:08X}")).collect();
    s.push_str(&format!(":{:04X}", a.port()));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_connection_is_found_in_the_table_with_its_holder() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        let (pids, uid) = holders(peer, l.local_addr().unwrap()).unwrap();
        assert_eq!(pids, vec![std::process::id() as i32]);
        // SAFETY: geteuid cannot fail.
        assert_eq!(uid, unsafe { libc::geteuid() });
        // The other direction is our own accepted socket, not the client's.
        let other = SocketAddr::from(([127, 0, 0, 1], 1));
        assert!(holders(other, l.local_addr().unwrap()).is_err());
    }

    #[test]
    fn addresses_print_as_the_kernel_prints_them() {
        // proc(5)'s example on a little-endian machine: 127.0.0.1:8080.
        if cfg!(target_endian = "little") {
            assert_eq!(hex_addr("127.0.0.1:8080".parse().unwrap()), "0100007F:1F90");
            assert_eq!(
                hex_addr("[::1]:80".parse().unwrap()),
                "00000000000000000000000001000000:0050"
            );
        }
    }
}
