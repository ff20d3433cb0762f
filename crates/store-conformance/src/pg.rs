//! A database of its own on the real PostgreSQL, for a test: made when the
//! test asks, dropped (its connections ended) when it is dropped, passed or
//! failed. The server is `BROOD_TEST_POSTGRES`, an administrator's
//! connection string; default `postgres://root:brood@127.0.0.1:5432/postgres`,
//! which `.ci/setup` makes answer.

use std::sync::atomic::{AtomicU32, Ordering};

use tokio_postgres::NoTls;

pub fn admin_url() -> String {
    std::env::var("BROOD_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://root:brood@127.0.0.1:5432/postgres".into())
}

/// Runs `sql` as the administrator (on a runtime of its own: callers may be
/// plain threads or inside one).
fn admin(sql: &str) {
    run_sql(&admin_url(), sql);
}

/// Runs `sql` as the administrator on database `db` of the same server.
pub fn admin_on(db: &str, sql: &str) {
    let base = admin_url();
    let at = base.rfind('/').unwrap();
    run_sql(&format!("{}/{db}", &base[..at]), sql);
}

fn run_sql(url: &str, sql: &str) {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    // A thread of its own, so no caller's runtime is in the way.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap_or_else(|e| {
                panic!("PostgreSQL does not answer at {url} ({e}): run `bash .ci/setup`, or set BROOD_TEST_POSTGRES")
            });
            let task = tokio::spawn(conn);
            c.batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            drop(c);
            let _ = task.await;
        });
    })
    .join()
    .unwrap();
}

/// A fresh database, dropped with this value.
pub struct Fresh {
    pub name: String,
    /// Its connection string (the administrator's, on this database).
    pub url: String,
}

impl Fresh {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Fresh {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "brood_t{}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        admin(&format!("CREATE DATABASE {name}"));
        let base = admin_url();
        let at = base.rfind('/').unwrap();
        let url = format!("{}/{name}", &base[..at]);
        Fresh { name, url }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        admin(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// A PostgreSQL server of the test's own: `initdb` into a directory of its
/// own, started on a free port of 127.0.0.1 (trust auth, superuser `root`),
/// for a test that stops and restarts the server under running nodes while
/// the machine's shared server, which other tests use at the same time, is
/// left alone. Stopped and removed when dropped. Run as root, the server
/// runs as the `postgres` user (PostgreSQL refuses to run as root).
pub struct Private {
    dir: std::path::PathBuf,
    bin: std::path::PathBuf,
    as_postgres: bool,
    pub port: u16,
    /// The administrator's connection string, on database `postgres`.
    pub url: String,
}

impl Private {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Private {
        static N: AtomicU32 = AtomicU32::new(0);
        let bin = server_bin_dir();
        let dir = std::env::temp_dir().join(format!(
            "brood-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // SAFETY: geteuid cannot fail.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        if as_postgres {
            run("chown", &["postgres:", dir.to_str().unwrap()], false);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = Private {
            url: format!("postgres://root@127.0.0.1:{port}/postgres"),
            dir,
            bin,
            as_postgres,
            port,
        };
        p.pg(
            "initdb",
            &[
                "-D",
                p.data().to_str().unwrap(),
                "-U",
                "root",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        p.start();
        p
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.join("data")
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        self.pg(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &opts,
                "-w",
                "start",
            ],
        );
    }

    /// Stops the server as a crash would (`immediate`: no checkpoint, every
    /// connection cut); what was committed survives in the WAL.
    pub fn stop_hard(&self) {
        self.pg(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    fn pg(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let exe = exe.to_str().unwrap();
        if self.as_postgres {
            let mut all = vec!["-u", "postgres", "--", exe];
            all.extend_from_slice(args);
            run("runuser", &all, true);
        } else {
            run(exe, args, true);
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let data = self.data();
        let exe = self.bin.join("pg_ctl");
        let args = ["-D", data.to_str().unwrap_or(""), "-m", "immediate", "stop"];
        #[allow(clippy::disallowed_methods)]
        let _ = if self.as_postgres {
            std::process::Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&exe)
                .args(args)
                .output()
        } else {
            std::process::Command::new(&exe).args(args).output()
        };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The newest PostgreSQL server's binaries (Debian's layout).
fn server_bin_dir() -> std::path::PathBuf {
    let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .expect("no PostgreSQL server binaries (initdb) under /usr/lib/postgresql: install the postgresql package (`bash .ci/setup` does)")
}

fn run(exe: &str, args: &[&str], show: bool) {
    #[allow(clippy::disallowed_methods)]
    let out = std::process::Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{exe}: {e}"));
    assert!(
        out.status.success(),
        "{exe} {args:?} failed: {}{}",
        if show {
            String::from_utf8_lossy(&out.stdout)
        } else {
            "".into()
        },
        String::from_utf8_lossy(&out.stderr)
    );
}
