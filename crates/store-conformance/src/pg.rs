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
    let url = admin_url();
    let sql = sql.to_owned();
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
