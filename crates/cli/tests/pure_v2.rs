//! Resource limits on a pure cgroup-v2 host (issue 3 item 5). This machine is
//! hybrid (memory and pids are bound to v1 hierarchies, and a controller in use
//! on v1 cannot be moved to v2 while the host runs), so the test boots a real
//! Linux kernel in QEMU with `cgroup_no_v1=all`, where every controller is on
//! the unified hierarchy, and runs the real `brood` binary there: `brood run`
//! with a `pids_max` policy over a fork bomb and a `memory_max` policy over a
//! memory hog, and `brood doctor`. The guest is an initramfs this test writes
//! (busybox, the `brood` binary and the libraries it links), so nothing of the
//! host is shared but the kernel image.
//!
//! Needs `qemu-system-x86_64`, a kernel in `/boot` and a static busybox
//! (Debian: `qemu-system-x86 linux-image-amd64 busybox-static`; `.ci/setup`
//! installs them). Missing, the test fails naming what is missing. The guest
//! runs under software emulation (about 15 s here).

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::exe;

/// A newc ("070701") cpio archive, the format the kernel unpacks as initramfs.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let name = name.trim_start_matches('/');
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }

    /// A host file at the same path in the guest, with the directories above it.
    fn file_from_host(&mut self, host: &Path, guest: &str, dirs: &mut Vec<String>) {
        let mut acc = String::new();
        for comp in guest
            .trim_start_matches('/')
            .split('/')
            .rev()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            acc.push('/');
            acc.push_str(comp);
            if !dirs.contains(&acc) {
                self.dir(&acc);
                dirs.push(acc.clone());
            }
        }
        let data = std::fs::read(host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
        self.entry(guest, 0o100755, &data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// The shared libraries a dynamically linked binary loads, from `ldd`.
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let o = Command::new("ldd").arg(bin).output().expect("ldd runs");
    assert!(
        o.status.success(),
        "ldd {}: {}",
        bin.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn newest_kernel() -> PathBuf {
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .collect();
    kernels.sort();
    kernels.pop().unwrap_or_else(|| {
        panic!("no kernel image in /boot: a pure cgroup-v2 guest needs one (Debian: apt-get install linux-image-amd64; `bash .ci/setup` installs it)")
    })
}

fn need(tool: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"] {
        let p = Path::new(dir).join(tool);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{tool} is missing: a pure cgroup-v2 guest needs it (Debian: apt-get install {package}; `bash .ci/setup` installs it)"
    )
}

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "@@controllers $(cat /sys/fs/cgroup/cgroup.controllers)"
echo '{"resources": {"pids_max": 16}}' > /tmp/pids.json
echo '{"resources": {"memory_max": 67108864}}' > /tmp/mem.json
echo '@@doctor-begin'
/brood --root /tmp/r doctor
echo '@@doctor-end'
echo '@@pids-begin'
/brood --root /tmp/r run --grace 1 --allow-weaker-sandbox --policy /tmp/pids.json -- /brood test-agent --fork-bomb 64 --result pids-ok
echo "@@pids-exit $?"
echo '@@mem-begin'
/brood --root /tmp/r run --grace 1 --allow-weaker-sandbox --policy /tmp/mem.json --json -- /brood test-agent --memory-hog 512 --result mem-ok
echo "@@mem-exit $?"
echo '{"resources": {"cpu_weight": 250}}' > /tmp/cpu.json
/brood --root /tmp/r run --grace 1 --allow-weaker-sandbox --policy /tmp/cpu.json -- /brood test-agent --sleep-ms 4000 --result cpu-ok > /tmp/cpu.out &
w=''
i=0
while [ -z "$w" ] && [ $i -lt 200 ]; do
  for f in $(find /sys/fs/cgroup -name cpu.weight); do
    case "$f" in *brood-*/r1.agent-*) w=$(cat "$f");; esac
  done
  i=$((i + 1))
  sleep 0.05
done
echo "@@cpu-weight $w"
wait
echo "@@cpu-exit $?"
echo "@@leftover $(find /sys/fs/cgroup -mindepth 1 -type d -name 'brood-*' | wc -l)"
echo '@@done'
poweroff -f
"#;

/// The lines between `@@<what>-begin` and `@@<what>-end` (or the next `@@`).
fn section<'a>(out: &'a str, what: &str) -> Vec<&'a str> {
    let begin = format!("@@{what}-begin");
    out.lines()
        .map(|l| l.trim_end_matches('\r'))
        .skip_while(|l| !l.ends_with(&begin))
        .skip(1)
        .take_while(|l| !l.contains("@@"))
        .collect()
}

fn value<'a>(out: &'a str, key: &str) -> &'a str {
    let tag = format!("@@{key} ");
    out.lines()
        .find_map(|l| l.trim_end_matches('\r').split_once(&tag).map(|(_, v)| v))
        .unwrap_or_else(|| panic!("the guest printed no {tag:?}:\n{out}"))
}

#[test]
fn limits_hold_on_a_pure_cgroup_v2_kernel() {
    let qemu = need("qemu-system-x86_64", "qemu-system-x86");
    let busybox = need("busybox", "busybox-static");
    assert!(
        !Command::new("ldd")
            .arg(&busybox)
            .output()
            .unwrap()
            .status
            .success(),
        "{} is dynamically linked; the guest needs a static one (Debian: apt-get install busybox-static)",
        busybox.display()
    );
    let kernel = newest_kernel();
    let brood = Path::new(exe());

    let mut cpio = Cpio::default();
    let mut dirs = Vec::new();
    for d in [
        "/bin",
        "/proc",
        "/sys",
        "/dev",
        "/tmp",
        "/etc",
        "/sys/fs",
        "/sys/fs/cgroup",
    ] {
        if !dirs.contains(&d.to_owned()) {
            cpio.dir(d);
            dirs.push(d.to_owned());
        }
    }
    cpio.entry("/init", 0o100755, INIT.as_bytes());
    cpio.file_from_host(&busybox, "/bin/busybox", &mut dirs);
    cpio.file_from_host(brood, "/brood", &mut dirs);
    for lib in libraries(brood) {
        let guest = lib.to_string_lossy().into_owned();
        cpio.file_from_host(&lib, &guest, &mut dirs);
    }
    let work = tempfile::tempdir().unwrap();
    let initrd = work.path().join("initrd.cpio");
    std::fs::write(&initrd, cpio.finish()).unwrap();

    // Software emulation: nested KVM on this kind of machine refuses the
    // guest's MSRs or stalls it, and the guest boots in seconds without it.
    let mut cmd = Command::new(&qemu);
    cmd.args(["-machine", "accel=tcg"])
        .args(["-cpu", "max"])
        .args(["-m", "1024", "-smp", "2", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            "console=ttyS0 cgroup_no_v1=all lsm=landlock,yama panic=-1 loglevel=4",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("qemu starts");
    // Bounded: a guest that hangs is killed and the test fails with its output.
    let limit = Duration::from_secs(300);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let _ = std::io::stderr().write_all(out.as_bytes());
    assert!(
        status.is_some(),
        "the guest did not power off within {limit:?}:\n{out}\n{err}"
    );
    assert!(
        out.contains("@@done"),
        "the guest did not finish its script:\n{out}\n{err}"
    );

    // Every limit controller is on the unified hierarchy: a pure v2 host.
    let controllers = value(&out, "controllers");
    for c in ["memory", "pids", "cpu"] {
        assert!(
            controllers.split_whitespace().any(|x| x == c),
            "the guest's cgroup2 root lacks {c}: {controllers}"
        );
    }
    let doctor = section(&out, "doctor").join("\n");
    assert!(
        doctor.contains("v2"),
        "doctor does not see cgroup v2:\n{doctor}"
    );

    // The fork bomb stops at the policy's pids_max, and the run still ends.
    let pids = section(&out, "pids");
    let line = pids
        .iter()
        .find(|l| l.contains("fork-bomb:"))
        .unwrap_or_else(|| panic!("no fork-bomb line:\n{}", pids.join("\n")));
    let stopped: u32 = line
        .split("stopped at ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the fork bomb was not stopped: {line}"));
    assert!(
        stopped < 16,
        "{stopped} processes forked under pids_max 16: {line}"
    );
    assert_eq!(value(&out, "pids-exit"), "0", "{}", pids.join("\n"));

    // The memory hog is killed by the OOM killer at memory_max, and says so.
    let mem = section(&out, "mem").join("\n");
    assert!(
        mem.contains("memory_max") && mem.contains("OOM"),
        "the memory hog was not stopped at memory_max:\n{mem}"
    );
    assert_ne!(value(&out, "mem-exit"), "0", "{mem}");
    // cpu_weight is the v2 weight itself, written on the agent's group.
    assert_eq!(value(&out, "cpu-weight"), "250");
    assert_eq!(value(&out, "cpu-exit"), "0");
    assert_eq!(value(&out, "leftover"), "0", "stray groups in the guest");
}
