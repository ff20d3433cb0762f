//! The socket probes (issue 24, "default-deny IPC"): the test agent tries to
//! reach what a hostile child would (a UNIX socket by path or by abstract
//! name, a UDP port, another brood daemon's control socket, every socket
//! family the kernel knows, an io_uring) and reports what the kernel let it
//! do, in [`crate::probe`]'s line format.

use std::io::{self, Read, Write};
use std::net::UdpSocket;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::outcome::outcome;

/// How long a probe waits for an answer on a socket it reached.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Socket families by number (linux/socket.h), for the report.
const FAMILIES: &[(libc::c_int, &str)] = &[
    (libc::AF_UNIX, "AF_UNIX"),
    (libc::AF_INET, "AF_INET"),
    (libc::AF_AX25, "AF_AX25"),
    (libc::AF_IPX, "AF_IPX"),
    (libc::AF_APPLETALK, "AF_APPLETALK"),
    (libc::AF_NETROM, "AF_NETROM"),
    (libc::AF_BRIDGE, "AF_BRIDGE"),
    (libc::AF_ATMPVC, "AF_ATMPVC"),
    (libc::AF_X25, "AF_X25"),
    (libc::AF_INET6, "AF_INET6"),
    (libc::AF_ROSE, "AF_ROSE"),
    (libc::AF_DECnet, "AF_DECnet"),
    (libc::AF_NETBEUI, "AF_NETBEUI"),
    (libc::AF_SECURITY, "AF_SECURITY"),
    (libc::AF_KEY, "AF_KEY"),
    (libc::AF_NETLINK, "AF_NETLINK"),
    (libc::AF_PACKET, "AF_PACKET"),
    (libc::AF_ASH, "AF_ASH"),
    (libc::AF_ECONET, "AF_ECONET"),
    (libc::AF_ATMSVC, "AF_ATMSVC"),
    (libc::AF_RDS, "AF_RDS"),
    (libc::AF_SNA, "AF_SNA"),
    (libc::AF_IRDA, "AF_IRDA"),
    (libc::AF_PPPOX, "AF_PPPOX"),
    (libc::AF_WANPIPE, "AF_WANPIPE"),
    (libc::AF_LLC, "AF_LLC"),
    (26, "AF_IB"),
    (27, "AF_MPLS"),
    (libc::AF_CAN, "AF_CAN"),
    (libc::AF_TIPC, "AF_TIPC"),
    (libc::AF_BLUETOOTH, "AF_BLUETOOTH"),
    (libc::AF_IUCV, "AF_IUCV"),
    (libc::AF_RXRPC, "AF_RXRPC"),
    (libc::AF_ISDN, "AF_ISDN"),
    (libc::AF_PHONET, "AF_PHONET"),
    (libc::AF_IEEE802154, "AF_IEEE802154"),
    (libc::AF_CAIF, "AF_CAIF"),
    (libc::AF_ALG, "AF_ALG"),
    (libc::AF_NFC, "AF_NFC"),
    (libc::AF_VSOCK, "AF_VSOCK"),
    (41, "AF_KCM"),
    (42, "AF_QIPCRTR"),
    (43, "AF_SMC"),
    (libc::AF_XDP, "AF_XDP"),
    (45, "AF_MCTP"),
];

const TYPES: &[(libc::c_int, &str)] = &[
    (libc::SOCK_STREAM, "stream"),
    (libc::SOCK_DGRAM, "dgram"),
    (libc::SOCK_RAW, "raw"),
    (libc::SOCK_SEQPACKET, "seqpacket"),
];

/// `--probe-unix PATH`: a stream connect to a UNIX socket by path.
pub fn unix(path: &Path) -> String {
    let r = UnixStream::connect(path).map(drop);
    format!("unix {}: {}", path.display(), outcome(&r))
}

/// `--probe-abstract NAME`: a stream connect to the abstract UNIX socket
/// `\0NAME` (unix(7)), which no file guards.
pub fn abstract_unix(name: &str) -> String {
    let r = connect_abstract(name);
    format!("abstract {name}: {}", outcome(&r))
}

fn connect_abstract(name: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixStream::connect_addr(&addr).map(drop)
}

/// `--probe-udp PORT`: a UDP datagram to 127.0.0.1:PORT (a DNS server's,
/// say). `ok` means the datagram left: UDP has no handshake to refuse it.
pub fn udp(port: u16) -> String {
    let r = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.send_to(b"\0", ("127.0.0.1", port)))
        .map(drop);
    format!("udp {port}: {}", outcome(&r))
}

/// `--probe-families`: socket(2) for every family and the four common
/// types; the line lists what the kernel created (`families: none` when
/// nothing), so a test can compare it with what the policy grants.
pub fn families() -> String {
    let mut made = Vec::new();
    for &(family, fname) in FAMILIES {
        for &(ty, tname) in TYPES {
            // SAFETY: socket(2) with integer arguments; the fd is closed at once.
            let fd = unsafe { libc::socket(family, ty | libc::SOCK_CLOEXEC, 0) };
            if fd >= 0 {
                // SAFETY: our own fresh fd.
                unsafe { libc::close(fd) };
                made.push(format!("{fname}/{tname}"));
            }
        }
    }
    // socketpair(2) of UNIX stream sockets, which reaches nothing outside.
    let mut pair = [-1; 2];
    // SAFETY: socketpair(2) writing two fds into a stack array.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) } == 0 {
        for fd in pair {
            // SAFETY: our own fresh fds.
            unsafe { libc::close(fd) };
        }
        made.push("socketpair/AF_UNIX".to_owned());
    }
    if made.is_empty() {
        "families: none".to_owned()
    } else {
        format!("families: {}", made.join(" "))
    }
}

/// `--probe-io-uring`: io_uring_setup(2), which can make and connect
/// sockets without socket(2).
pub fn io_uring() -> String {
    // struct io_uring_params: 120 bytes, zeroed (io_uring_setup(2)).
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(2) with a zeroed params struct on the stack.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    let r = if fd >= 0 {
        // SAFETY: our own fresh fd.
        unsafe { libc::close(fd as libc::c_int) };
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    };
    format!("io-uring: {}", outcome(&r))
}

/// `--probe-brood-socket PATH`: asks the brood daemon behind the control
/// socket PATH for a new root agent (`POST /api/agents`), as an agent that
/// found another daemon's socket would; the line gives the answer's HTTP
/// status (`http 403` when the daemon refused to take it for its operator).
pub fn brood_socket(path: &Path) -> String {
    let r = post_agent(path);
    match r {
        Ok(status) => format!("brood-socket {}: http {status}", path.display()),
        Err(e) => format!("brood-socket {}: {}", path.display(), outcome(&Err(e))),
    }
}

fn post_agent(path: &Path) -> io::Result<u16> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    let body = format!(
        r#"{{"name":"intruder-{}","argv":["/bin/sh","-c","sleep 600"]}}"#,
        std::process::id()
    );
    let req = format!(
        "POST /api/agents HTTP/1.1\r\nHost: brood\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // A refusal may come, and the connection close, before the body is
    // written: what was answered decides, not the write.
    let wrote = s.write_all(req.as_bytes());
    let mut answer = String::new();
    let read = s.read_to_string(&mut answer);
    if answer.is_empty() {
        wrote?;
        read?;
    }
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {answer:?}")))
}
