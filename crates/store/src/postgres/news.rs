//! News between the nodes sharing one database (issue 15, SPEC 15): a node
//! that committed a write says so with `NOTIFY`, and every other node,
//! `LISTEN`ing on a connection of its own, hears it at once and looks at the
//! store (the stops recorded for its agents, the waits it answers, the event
//! log it streams) instead of waiting for its next tick.
//!
//! A notification carries no data, only the sender's node id and what its
//! writes since its last one changed (`crate::Changed`, as a number: `<id>
//! <bits>`), so that a node looks only where the news concerns it. The
//! store stays the one truth, so a lost notification costs latency, never
//! correctness (the ticks still look). Announcements are coalesced: one in flight at a
//! time, the next one at least [`SPACING`] later, however many writes
//! committed meanwhile; so a node under load sends at most a few hundred a
//! second, each its own tiny transaction outside the writes' (a `NOTIFY`
//! inside a write would serialise every commit on the server's notify queue
//! lock).
//!
//! The listening connection is outside the pool (a pooled connection is
//! handed to other calls and would drop what arrives meanwhile); when it is
//! lost it is made again after [`RETRY`], and the listener is told, since news
//! may have been missed in between.

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

use super::Pool;
use crate::Changed;

/// The channel every node of a database listens on.
const CHANNEL: &str = "brood_news";
/// At least this long between two announcements of one node.
const SPACING: Duration = Duration::from_millis(5);
/// How long a lost connection (announcing or listening) waits before the
/// next attempt.
const RETRY: Duration = Duration::from_millis(500);

/// What a store that announces holds: the poke its writes give, and what
/// they changed since the last announcement.
pub(crate) struct News {
    me: String,
    poke: Arc<Notify>,
    changed: Arc<AtomicU8>,
}

impl News {
    /// A write committed that changed `what`: announce it (soon, coalesced).
    pub(crate) fn wrote(&self, what: Changed) {
        if what == Changed::NONE {
            return;
        }
        self.changed.fetch_or(what.bits(), Ordering::SeqCst);
        self.poke.notify_one();
    }

    /// The node this store announces as.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }
}

/// Starts announcing this node's writes and listening for the others', on
/// the pool's runtime. `on_news` runs on that runtime's thread: it must not
/// block.
pub(crate) fn start(
    pool: &Arc<Pool>,
    me: &str,
    on_news: Arc<dyn Fn(Changed) + Send + Sync>,
) -> super::Tx<News> {
    let rt = pool.runtime()?;
    let poke = Arc::new(Notify::new());
    let changed = Arc::new(AtomicU8::new(0));
    rt.spawn(announce(
        pool.clone(),
        me.to_owned(),
        poke.clone(),
        changed.clone(),
    ));
    rt.spawn(listen(pool.clone(), me.to_owned(), on_news));
    Ok(News {
        me: me.to_owned(),
        poke,
        changed,
    })
}

/// The announcer: waits for a poke, sends one `NOTIFY` for every write since
/// the last, saying what they changed, and keeps its own connection.
async fn announce(pool: Arc<Pool>, me: String, poke: Arc<Notify>, changed: Arc<AtomicU8>) {
    let mut client: Option<tokio_postgres::Client> = None;
    let mut down = false;
    loop {
        poke.notified().await;
        // What changed since the last announcement; a write after this
        // read pokes again, so it is in the next one.
        let what = changed.swap(0, Ordering::SeqCst);
        if what == 0 {
            continue;
        }
        let payload = format!("{me} {what}");
        loop {
            let c = match client.take() {
                Some(c) if !c.is_closed() => c,
                _ => match connect(&pool).await {
                    Ok(c) => c,
                    Err(e) => {
                        say_down(&mut down, &pool.target, "connecting to announce writes", &e);
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                },
            };
            match c
                .execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &payload])
                .await
            {
                Ok(_) => {
                    client = Some(c);
                    down = false;
                    break;
                }
                Err(e) => {
                    say_down(&mut down, &pool.target, "announcing writes", &e);
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
        tokio::time::sleep(SPACING).await;
    }
}

/// The listener: a connection of its own that `LISTEN`s, calls `on_news` for
/// every other node's announcement, and is made again when lost.
async fn listen(pool: Arc<Pool>, me: String, on_news: Arc<dyn Fn(Changed) + Send + Sync>) {
    let mut down = false;
    loop {
        match listen_once(&pool, &me, &*on_news, &mut down).await {
            Ok(()) => say_down(
                &mut down,
                &pool.target,
                "listening",
                &"the connection ended",
            ),
            Err(e) => say_down(&mut down, &pool.target, "listening", &e),
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// One listening connection, until it ends.
async fn listen_once(
    pool: &Pool,
    me: &str,
    on_news: &(dyn Fn(Changed) + Send + Sync),
    down: &mut bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = pool.config.connect(NoTls).await?;
    // The connection is driven here, not by a task of its own: its messages
    // (the notifications) come out of this poll and nowhere else.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return Ok(());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    if std::mem::take(down) {
        eprintln!("brood store: listening to {} again", pool.target);
    }
    // Whatever happened while nobody listened (the first start, a lost
    // connection) is in the store: look once, everywhere.
    on_news(Changed::ALL);
    while let Some(payload) = rx.recv().await {
        let (from, what) = heard(&payload);
        if from != me {
            on_news(what);
        }
    }
    match driver.await {
        Ok(r) => r,
        // The driver task cannot panic; a cancelled one ends the same way.
        Err(_) => Ok(()),
    }
}

/// Who a notification is from and what it says changed: `<id> <bits>`; a
/// payload without the bits (an older node's) changed everything.
fn heard(payload: &str) -> (&str, Changed) {
    match payload.rsplit_once(' ') {
        Some((from, bits)) => match bits.parse::<u8>() {
            Ok(b) => (from, Changed::from_bits(b)),
            Err(_) => (payload, Changed::ALL),
        },
        None => (payload, Changed::ALL),
    }
}

/// Says once per outage that the news connection is down (the store's
/// calls report their own failures; this one would repeat every [`RETRY`]).
fn say_down(down: &mut bool, target: &str, doing: &str, e: &dyn std::fmt::Display) {
    if !std::mem::replace(down, true) {
        eprintln!("brood store: news with {target}: {doing}: {e}; retrying");
    }
}

async fn connect(pool: &Pool) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = pool.config.connect(NoTls).await?;
    tokio::spawn(async move {
        // Ends with the connection; the client sees it closed.
        let _ = connection.await;
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::heard;
    use crate::Changed;

    #[test]
    fn a_notification_says_who_and_what_and_an_old_one_says_everything() {
        let (from, what) = heard("s123-9 3");
        assert_eq!(from, "s123-9");
        assert!(what.any(Changed::EVENTS) && what.any(Changed::ENDS));
        assert!(!what.any(Changed::PLACED | Changed::INPUTS | Changed::STOPS));
        assert_eq!(heard("s123-9"), ("s123-9", Changed::ALL));
        assert_eq!(heard("node a x"), ("node a x", Changed::ALL));
    }
}
