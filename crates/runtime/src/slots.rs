//! Concurrency-slot counters (SPEC 9): how many started processes each tenant has.
//!
//! The supervisors' own agents are the truth; a counter is the fast path the
//! dispatcher consults at every start and end, one call (one round trip) each. A
//! reconciler recomputes each supervisor's share from its live agents every
//! [`RECONCILE_PERIOD`] and calls [`Slots::repair`], and gives back the shares of
//! supervisors that are gone ([`Slots::forget_holders`], judged from the store's
//! registry and the process table), so whatever drift a crash, a lost reply or a
//! dead supervisor leaves behind is corrected within one period.
//!
//! * [`Embedded`]: an in-process map, the default (one supervisor).
//! * [`StoreShares`]: a share a supervisor in the store itself, for nodes that
//!   share a store but no Redis (issue 15).
//! * [`Redis`]: `brood:slots:<tenant>`, a share a supervisor, in a Redis server
//!   shared by several supervisors, spoken to over one blocking connection with a minimal RESP2
//!   client (see [`Redis`] for why not the `redis` crate).
//!
//! [`open`] picks one from the configured URL.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use brood_core::TenantId;

/// How often the reconciler recomputes the counts (SPEC 9).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(30);

/// How long a Redis counter outlives its last write: three reconcile periods. A
/// live supervisor's reconciler rewrites every counter it owns each period, so only
/// a counter whose supervisors are all gone reaches it, and then it disappears on
/// its own instead of holding slots nobody uses.
pub const DEFAULT_TTL: Duration = Duration::from_secs(90);

/// How long connecting to Redis, or waiting for one reply, may take. The counter
/// is called from the dispatcher loop: a Redis that stopped answering must turn
/// into an error quickly, not a hung supervisor.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// A failed slot-counter operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// The configured URL cannot be used.
    #[error("slot counter URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    /// The store's shares (nodes sharing no Redis) could not be read or written.
    #[error("slot counter in the store: {command} failed: {detail}")]
    Store {
        command: &'static str,
        detail: String,
    },
    /// Redis could not be reached, broke the connection, or refused a command.
    #[error("slot counter at {url}: {command} failed: {detail}")]
    Redis {
        url: String,
        command: &'static str,
        detail: String,
    },
}

/// A per-tenant counter of held concurrency slots.
///
/// Every method is one synchronous call (for [`Redis`], one round trip): they run
/// on the supervisor's dispatcher loop, once per process start or end.
pub trait Slots: Send + Sync {
    /// Takes a slot for `tenant` if fewer than `max` are held; `false` (and nothing
    /// taken) when all `max` are.
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError>;
    /// Gives a slot back. Never takes the count below 0: a release without an
    /// acquire is drift, which the reconciler repairs, not a negative count.
    fn release(&self, tenant: &TenantId) -> Result<(), SlotError>;
    /// The slots `tenant` holds according to the counter.
    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError>;
    /// Sets this supervisor's share of the count to `actual` (the slots its
    /// own started agents hold, which it alone knows exactly) and returns
    /// the drift it found: the share's old value minus `actual` (positive:
    /// the counter over-counted and was refusing starts it should have
    /// allowed).
    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError>;
    /// Gives back the shares of the supervisors `alive` says are gone (their
    /// agents died with them); the slots freed. A counter of one supervisor
    /// has no other shares.
    fn forget_holders(
        &self,
        tenant: &TenantId,
        alive: &dyn Fn(&str) -> bool,
    ) -> Result<u64, SlotError> {
        let _ = (tenant, alive);
        Ok(0)
    }
    /// Which counter this is, for logs and `brood status` (no credentials).
    fn describe(&self) -> String;
}

/// The counter for a configured URL: none is [`Embedded`], `redis://` is
/// [`Redis`] (checked with a PING, so a wrong address fails at start, not at the
/// first spawn), holding its slots as `holder` (the supervisor's id).
pub fn open(url: Option<&str>, holder: &str) -> Result<Arc<dyn Slots>, SlotError> {
    match url {
        None => Ok(Arc::new(Embedded::new())),
        Some(url) => Ok(Arc::new(Redis::connect(url, holder)?)),
    }
}

/// The holders among `holders` that are gone: never the caller (`me`), nor
/// one `alive` vouches for.
fn gone<'a>(
    holders: impl Iterator<Item = &'a str>,
    me: &str,
    alive: &dyn Fn(&str) -> bool,
) -> Vec<&'a str> {
    holders
        .filter(|h| !h.is_empty() && *h != me && !alive(h))
        .collect()
}

/// Drift as the trait reports it: old minus actual, saturating rather than
/// wrapping for counts no real tree reaches.
fn drift(old: i64, actual: u64) -> i64 {
    old.saturating_sub(i64::try_from(actual).unwrap_or(i64::MAX))
}

// ---------------------------------------------------------------------------
// Embedded
// ---------------------------------------------------------------------------

/// The in-process counter: one supervisor, no network. Tenants at 0 are removed,
/// so the map holds only tenants with running processes.
#[derive(Debug, Default)]
pub struct Embedded {
    counts: Mutex<HashMap<TenantId, u64>>,
}

impl Embedded {
    pub fn new() -> Embedded {
        Embedded::default()
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, u64>> {
        // Every critical section is a single read or write of the map, so a
        // panic elsewhere cannot leave it half-updated: a poisoned lock is safe
        // to keep using, and failing every later start would be worse.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Slots for Embedded {
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError> {
        let mut counts = self.counts();
        let held = counts.get(tenant).copied().unwrap_or(0);
        if held >= u64::from(max) {
            return Ok(false);
        }
        counts.insert(tenant.clone(), held + 1);
        Ok(true)
    }

    fn release(&self, tenant: &TenantId) -> Result<(), SlotError> {
        let mut counts = self.counts();
        match counts.get(tenant).copied() {
            Some(held) if held > 1 => {
                counts.insert(tenant.clone(), held - 1);
            }
            _ => {
                counts.remove(tenant);
            }
        }
        Ok(())
    }

    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError> {
        Ok(self.counts().get(tenant).copied().unwrap_or(0))
    }

    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError> {
        let mut counts = self.counts();
        let old = if actual == 0 {
            counts.remove(tenant)
        } else {
            counts.insert(tenant.clone(), actual)
        }
        .unwrap_or(0);
        Ok(drift(i64::try_from(old).unwrap_or(i64::MAX), actual))
    }

    fn describe(&self) -> String {
        "embedded (in-process)".to_owned()
    }
}

// ---------------------------------------------------------------------------
// The store's shares
// ---------------------------------------------------------------------------

/// The counter of nodes that share a store but no Redis: each supervisor's
/// share a row of the store (`brood_store::SlotShares`), each call one
/// transaction (on PostgreSQL under a lock of the tenant's slots), so the
/// tenant's `max_concurrent` holds across every node.
pub struct StoreShares {
    store: Arc<dyn brood_store::Store>,
    holder: String,
}

impl StoreShares {
    pub fn new(store: Arc<dyn brood_store::Store>, holder: &str) -> StoreShares {
        StoreShares {
            store,
            holder: holder.to_owned(),
        }
    }

    fn failed(command: &'static str) -> impl Fn(brood_store::StoreError) -> SlotError {
        move |e| SlotError::Store {
            command,
            detail: e.to_string(),
        }
    }
}

impl Slots for StoreShares {
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError> {
        self.store
            .slot_acquire(tenant, &self.holder, max)
            .map_err(Self::failed("acquire"))
    }

    fn release(&self, tenant: &TenantId) -> Result<(), SlotError> {
        self.store
            .slot_release(tenant, &self.holder)
            .map_err(Self::failed("release"))
    }

    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError> {
        let shares = self
            .store
            .slot_shares(tenant)
            .map_err(Self::failed("count"))?;
        Ok(shares.iter().map(|s| s.1).sum())
    }

    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError> {
        let old = self
            .store
            .slot_repair(tenant, &self.holder, actual)
            .map_err(Self::failed("repair"))?;
        Ok(drift(i64::try_from(old).unwrap_or(i64::MAX), actual))
    }

    fn forget_holders(
        &self,
        tenant: &TenantId,
        alive: &dyn Fn(&str) -> bool,
    ) -> Result<u64, SlotError> {
        let shares = self
            .store
            .slot_shares(tenant)
            .map_err(Self::failed("shares"))?;
        let gone: Vec<String> = gone(shares.iter().map(|s| s.0.as_str()), &self.holder, alive)
            .into_iter()
            .map(str::to_owned)
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        self.store
            .slot_forget(tenant, &gone)
            .map_err(Self::failed("forget"))
    }

    fn describe(&self) -> String {
        "the store (shared by the nodes)".to_owned()
    }
}

// ---------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------

/// Sums a tenant's shares (the fields of its hash) into `held`. A share that
/// is not a number fails the script, which surfaces as an error naming it.
const SUM: &str = "\
local held = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  held = held + tonumber(v)
end
";

/// Takes a slot for holder ARGV[3] if fewer than ARGV[1] are held by all
/// holders together, refreshing the expiry (ARGV[2] seconds). A script: one
/// round trip and atomic, so two supervisors racing for the last slot never
/// both get it, nor both lose it while it is free.
const ACQUIRE: &str = "\
if held >= tonumber(ARGV[1]) then
  if held > 0 then
    redis.call('EXPIRE', KEYS[1], ARGV[2])
  end
  return 0
end
redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1";

/// Gives holder ARGV[2]'s slot back, never below 0, refreshing the expiry
/// (ARGV[1]); returns its new share. A share reaching 0 is removed, and the
/// last one the key with it, as the embedded map drops the tenant: only
/// tenants holding slots have a key.
const RELEASE: &str = "\
local n = tonumber(redis.call('HGET', KEYS[1], ARGV[2]) or '0')
if not n then
  return redis.error_reply(KEYS[1] .. ' ' .. ARGV[2] .. ' does not hold a count')
end
if n > 1 then
  n = redis.call('HINCRBY', KEYS[1], ARGV[2], -1)
  redis.call('EXPIRE', KEYS[1], ARGV[1])
  return n
end
redis.call('HDEL', KEYS[1], ARGV[2])
return 0";

/// Sets holder ARGV[3]'s share to ARGV[1] with the expiry ARGV[2] (0: removes
/// it); returns the old share (0 for none, or one holding garbage). One script,
/// so no acquire of the holder's can slip between the read and the write. A
/// key that is no hash (one count, as brood kept before shares, or garbage)
/// is dropped first: every supervisor's repair then writes its share back.
const REPAIR: &str = "\
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[3]) or '0') or 0
if ARGV[1] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[3])
else
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return old";

/// The holders of a tenant's shares, one a line.
const HOLDERS: &str = "return table.concat(redis.call('HKEYS', KEYS[1]), '\\n')";

/// Removes the shares of holders ARGV[1..]; returns the slots they held.
const FORGET: &str = "\
local freed = 0
for i = 1, #ARGV do
  freed = freed + (tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') or 0)
  redis.call('HDEL', KEYS[1], ARGV[i])
end
return freed";

/// A counter in Redis, shared by every supervisor pointed at the same server: a
/// hash at key `brood:slots:<tenant>` with one field a supervisor (its id), the
/// slots it holds, expiring [`DEFAULT_TTL`] after its last write. The count is
/// the sum of the shares. Shares rather than one number so that the count can
/// be set right without a race: each supervisor repairs its own share from
/// its own live agents (exact: its acquires and releases are its own), and
/// the shares of supervisors that are gone are given back
/// ([`Slots::forget_holders`]). One number repaired from the store's count
/// of started agents would miss the starts other supervisors have in flight
/// (a slot taken, the start not recorded yet) and let the tenant past its
/// limit.
///
/// The client is a minimal RESP2 one (PING, SELECT, GET, EVAL) rather than the
/// `redis` crate: `redis` 1.8.1 (the newest stable) with `default-features =
/// false` still adds 32 crates brood does not already build (url, idna and the
/// ICU normalisation tables with their proc-macros, combine, arcstr, xxhash-rust,
/// ...), for four commands over one blocking socket.
///
/// One connection, behind a mutex: the dispatcher is a single loop, so calls are
/// serial anyway. A connection found broken (the server restarted, or closed an
/// idle client) is replaced once per call; a timeout is not retried, since the
/// command may have run and a slow Redis would only make the wait twice as long.
pub struct Redis {
    /// The URL as configured, for errors and [`Slots::describe`].
    url: String,
    addr: Addr,
    /// The field of this supervisor's share.
    holder: String,
    ttl: Duration,
    timeout: Duration,
    conn: Mutex<Option<Conn>>,
}

/// Where a `redis://` URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Addr {
    host: String,
    port: u16,
    db: u32,
}

impl Redis {
    /// Parses `redis://host[:port][/db]` (port 6379, db 0 by default), connects and
    /// checks the server answers PING; its slots are held as `holder`.
    pub fn connect(url: &str, holder: &str) -> Result<Redis, SlotError> {
        let addr = parse_url(url)?;
        let redis = Redis {
            url: url.to_owned(),
            addr,
            holder: holder.to_owned(),
            ttl: DEFAULT_TTL,
            timeout: DEFAULT_TIMEOUT,
            conn: Mutex::new(None),
        };
        match redis.call("PING", &[b"PING"])? {
            Reply::Simple(s) if s == "PONG" => Ok(redis),
            other => Err(redis.error("PING", format!("answered {other:?}, not PONG"))),
        }
    }

    /// The same counter with another expiry (whole seconds, at least 1).
    pub fn with_ttl(mut self, ttl: Duration) -> Redis {
        self.ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// The Redis key holding `tenant`'s shares.
    pub fn key(tenant: &TenantId) -> String {
        format!("brood:slots:{tenant}")
    }

    fn ttl_secs(&self) -> String {
        self.ttl.as_secs().max(1).to_string()
    }

    fn error(&self, command: &'static str, detail: impl Into<String>) -> SlotError {
        SlotError::Redis {
            url: self.url.clone(),
            command,
            detail: detail.into(),
        }
    }

    /// Runs one command, replacing a broken connection once. `command` names it in
    /// errors. An error reply from the server is an error here too.
    fn call(&self, command: &'static str, args: &[&[u8]]) -> Result<Reply, SlotError> {
        let request = encode(args);
        // A lock poisoned by a panic mid-command may hold a connection with half a
        // reply unread; dropping it is enough to recover.
        let mut slot = match self.conn.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                let mut guard = poisoned.into_inner();
                *guard = None;
                guard
            }
        };
        let reused = slot.is_some();
        let mut conn = match slot.take() {
            Some(conn) => conn,
            None => self.open_conn(command)?,
        };
        let reply = match conn.round_trip(&request) {
            Ok(reply) => reply,
            Err(Failure::Gone(e)) if reused => {
                // The connection died while idle (the server restarted or closed
                // it), so the command almost surely never ran and is sent again on
                // a fresh one. In the rare case it did run before the reset, the
                // count is one off until the reconciler's next pass repairs it.
                tracing::debug!(url = %self.url, error = %e, "redis connection lost; reconnecting");
                conn = self.open_conn(command)?;
                conn.round_trip(&request)
                    .map_err(|f| self.error(command, f.to_string()))?
            }
            Err(f) => return Err(self.error(command, f.to_string())),
        };
        // Only a connection that finished its exchange goes back for reuse.
        *slot = Some(conn);
        match reply {
            Reply::Error(e) => Err(self.error(command, format!("server replied: {e}"))),
            reply => Ok(reply),
        }
    }

    /// Connects (trying each resolved address), sets the timeouts and selects the
    /// database.
    fn open_conn(&self, command: &'static str) -> Result<Conn, SlotError> {
        let fail = |detail: String| self.error(command, detail);
        let addrs = (self.addr.host.as_str(), self.addr.port)
            .to_socket_addrs()
            .map_err(|e| fail(format!("cannot resolve {}: {e}", self.addr.host)))?;
        let mut last = None;
        let mut stream = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(format!("cannot connect to {addr}: {e}")),
            }
        }
        let Some(stream) = stream else {
            return Err(fail(last.unwrap_or_else(|| {
                format!("{} resolves to no address", self.addr.host)
            })));
        };
        let setup = |e: io::Error| fail(format!("cannot set up the connection: {e}"));
        stream.set_read_timeout(Some(self.timeout)).map_err(setup)?;
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(setup)?;
        // Each request is one write followed by a wait for the reply; Nagle would
        // only add latency.
        stream.set_nodelay(true).map_err(setup)?;
        let writer = stream.try_clone().map_err(setup)?;
        let mut conn = Conn {
            reader: BufReader::new(stream),
            writer,
        };
        if self.addr.db != 0 {
            let db = self.addr.db.to_string();
            match conn.round_trip(&encode(&[b"SELECT", db.as_bytes()])) {
                Ok(Reply::Simple(_)) => {}
                Ok(other) => {
                    return Err(self.error("SELECT", format!("database {db}: {other:?}")));
                }
                Err(f) => return Err(self.error("SELECT", f.to_string())),
            }
        }
        Ok(conn)
    }

    fn eval(
        &self,
        command: &'static str,
        script: &str,
        key: &str,
        args: &[&str],
    ) -> Result<i64, SlotError> {
        let mut argv: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), b"1", key.as_bytes()];
        argv.extend(args.iter().map(|a| a.as_bytes()));
        match self.call(command, &argv)? {
            Reply::Int(n) => Ok(n),
            other => Err(self.error(command, format!("unexpected reply {other:?}"))),
        }
    }

    /// [`Redis::eval`] of a script whose answer is text.
    fn eval_text(
        &self,
        command: &'static str,
        script: &str,
        key: &str,
    ) -> Result<String, SlotError> {
        match self.call(command, &[b"EVAL", script.as_bytes(), b"1", key.as_bytes()])? {
            Reply::Bulk(v) => Ok(String::from_utf8_lossy(&v.unwrap_or_default()).into_owned()),
            other => Err(self.error(command, format!("unexpected reply {other:?}"))),
        }
    }
}

impl Slots for Redis {
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError> {
        let max = max.to_string();
        let got = self.eval(
            "EVAL acquire",
            &format!("{SUM}{ACQUIRE}"),
            &Redis::key(tenant),
            &[&max, &self.ttl_secs(), &self.holder],
        )?;
        Ok(got == 1)
    }

    fn release(&self, tenant: &TenantId) -> Result<(), SlotError> {
        self.eval(
            "EVAL release",
            RELEASE,
            &Redis::key(tenant),
            &[&self.ttl_secs(), &self.holder],
        )?;
        Ok(())
    }

    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError> {
        let held = self.eval(
            "EVAL count",
            &format!("{SUM}return held"),
            &Redis::key(tenant),
            &[],
        )?;
        // A negative share means more releases than acquires were recorded:
        // as far as the counter knows nothing is held. The reconciler repairs
        // the share itself.
        Ok(u64::try_from(held).unwrap_or(0))
    }

    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError> {
        let old = self.eval(
            "EVAL repair",
            REPAIR,
            &Redis::key(tenant),
            &[&actual.to_string(), &self.ttl_secs(), &self.holder],
        )?;
        Ok(drift(old, actual))
    }

    fn forget_holders(
        &self,
        tenant: &TenantId,
        alive: &dyn Fn(&str) -> bool,
    ) -> Result<u64, SlotError> {
        let key = Redis::key(tenant);
        let holders = self.eval_text("EVAL holders", HOLDERS, &key)?;
        let gone = gone(holders.lines(), &self.holder, alive);
        if gone.is_empty() {
            return Ok(0);
        }
        let freed = self.eval("EVAL forget", FORGET, &key, &gone)?;
        Ok(u64::try_from(freed).unwrap_or(0))
    }

    fn describe(&self) -> String {
        format!("redis at {}", self.url)
    }
}

/// Reads `redis://host[:port][/db]`. Credentials and TLS are refused by name
/// rather than ignored, so a URL that needs them fails at start.
fn parse_url(url: &str) -> Result<Addr, SlotError> {
    let bad = |reason: &str| SlotError::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let supported = "supported: redis://host[:port][/db], or no URL for the embedded counter";
    let Some(rest) = url.strip_prefix("redis://") else {
        return Err(bad(&format!("unsupported scheme; {supported}")));
    };
    let (authority, db) = match rest.split_once('/') {
        Some((authority, "")) => (authority, 0),
        Some((authority, db)) => {
            let db = db
                .parse()
                .map_err(|_| bad(&format!("database {db:?} is not a number; {supported}")))?;
            (authority, db)
        }
        None => (rest, 0),
    };
    if authority.contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    if authority.contains(['?', '#']) {
        return Err(bad(&format!(
            "query parameters are not supported; {supported}"
        )));
    }
    // `[v6 address]:port` or `host:port`.
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(bad("unclosed [ in the host"));
        };
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(bad("unexpected text after the ]")),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(bad(&format!("no host; {supported}")));
    }
    let port = match port {
        None => 6379,
        Some(p) => p
            .parse()
            .ok()
            .filter(|&p: &u16| p != 0)
            .ok_or_else(|| bad(&format!("port {p:?} is not a port number")))?,
    };
    Ok(Addr {
        host: host.to_owned(),
        port,
        db,
    })
}

// ---------------------------------------------------------------------------
// RESP2
// ---------------------------------------------------------------------------

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// The largest bulk reply accepted. Ours are a few digits; the cap stops a
/// misconfigured URL (some other service on the port) from making us allocate
/// whatever length it happens to send.
const MAX_BULK: usize = 1 << 20;
/// The deepest array nesting accepted, for the same reason.
const MAX_DEPTH: usize = 4;

/// Why a round trip failed.
#[derive(Debug)]
enum Failure {
    /// The connection was already dead: the write failed, or the server closed
    /// it before sending a byte of the reply. The command (almost surely) did not
    /// run.
    Gone(io::Error),
    /// Anything else: a timeout, a connection lost mid-reply, a reply that is not
    /// RESP. The command may have run; not retried.
    Broken(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Gone(e) => write!(f, "connection lost: {e}"),
            Failure::Broken(detail) => f.write_str(detail),
        }
    }
}

/// One connection: a buffered reader and a writer on the same socket.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
            | io::ErrorKind::UnexpectedEof
    )
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl Conn {
    fn round_trip(&mut self, request: &[u8]) -> Result<Reply, Failure> {
        if let Err(e) = self.writer.write_all(request) {
            return Err(if is_gone(&e) {
                Failure::Gone(e)
            } else if is_timeout(&e) {
                Failure::Broken(format!("timed out sending the command: {e}"))
            } else {
                Failure::Broken(format!("cannot send the command: {e}"))
            });
        }
        // A dead connection usually still accepts the write (the kernel buffers
        // it) and shows up as end-of-file or a reset on the first read.
        match self.reader.fill_buf() {
            Ok([]) => {
                return Err(Failure::Gone(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed by the server",
                )));
            }
            Ok(_) => {}
            Err(e) if is_gone(&e) => return Err(Failure::Gone(e)),
            Err(e) if is_timeout(&e) => {
                return Err(Failure::Broken(format!("no reply within the timeout: {e}")));
            }
            Err(e) => return Err(Failure::Broken(format!("cannot read the reply: {e}"))),
        }
        read_reply(&mut self.reader, 0).map_err(|e| {
            Failure::Broken(if is_timeout(&e) {
                format!("reply cut short by the timeout: {e}")
            } else {
                format!("bad reply: {e}")
            })
        })
    }
}

/// A command as a RESP array of bulk strings.
fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn protocol(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail)
}

/// One CRLF-terminated line, without the CRLF.
fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    // Lines in our replies are short; the cap stops a non-Redis peer streaming
    // an endless line into memory.
    r.take(MAX_BULK as u64).read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(if line.is_empty() || line.len() < MAX_BULK {
            io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-reply")
        } else {
            protocol("line too long; is this a Redis server?".to_owned())
        });
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| protocol("reply line is not UTF-8".to_owned()))
}

fn read_reply(r: &mut impl BufRead, depth: usize) -> io::Result<Reply> {
    let line = read_line(r)?;
    let mut chars = line.chars();
    let kind = chars.next();
    let rest = chars.as_str();
    let int = |s: &str| {
        s.parse::<i64>()
            .map_err(|_| protocol(format!("{s:?} is not an integer")))
    };
    match kind {
        Some('+') => Ok(Reply::Simple(rest.to_owned())),
        Some('-') => Ok(Reply::Error(rest.to_owned())),
        Some(':') => Ok(Reply::Int(int(rest)?)),
        Some('$') => {
            let len = int(rest)?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(Reply::Bulk(None));
            };
            if len > MAX_BULK {
                return Err(protocol(format!("bulk reply of {len} bytes is too large")));
            }
            let mut buf = vec![0; len + 2];
            r.read_exact(&mut buf)?;
            if !buf.ends_with(b"\r\n") {
                return Err(protocol("bulk reply not terminated by CRLF".to_owned()));
            }
            buf.truncate(len);
            Ok(Reply::Bulk(Some(buf)))
        }
        Some('*') => {
            let len = int(rest)?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(Reply::Array(None));
            };
            if depth >= MAX_DEPTH || len > MAX_BULK {
                return Err(protocol("array reply too deep or too long".to_owned()));
            }
            let mut items = Vec::with_capacity(len.min(64));
            for _ in 0..len {
                items.push(read_reply(r, depth + 1)?);
            }
            Ok(Reply::Array(Some(items)))
        }
        _ => Err(protocol(format!(
            "{:?} is not a RESP reply; is this a Redis server?",
            line.chars().take(40).collect::<String>()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let addr = |host: &str, port, db| Addr {
            host: host.to_owned(),
            port,
            db,
        };
        assert_eq!(parse_url("redis://h").unwrap(), addr("h", 6379, 0));
        assert_eq!(parse_url("redis://h:7000").unwrap(), addr("h", 7000, 0));
        assert_eq!(parse_url("redis://h:7000/3").unwrap(), addr("h", 7000, 3));
        assert_eq!(parse_url("redis://h/").unwrap(), addr("h", 6379, 0));
        assert_eq!(
            parse_url("redis://[::1]:7000").unwrap(),
            addr("::1", 7000, 0)
        );
        assert_eq!(parse_url("redis://[::1]").unwrap(), addr("::1", 6379, 0));
        for (url, says) in [
            ("rediss://h", "unsupported scheme"),
            ("http://h", "redis://host[:port][/db]"),
            ("redis://", "no host"),
            ("redis://:7000", "no host"),
            ("redis://h:x", "not a port"),
            ("redis://h:0", "not a port"),
            ("redis://h:70000", "not a port"),
            ("redis://h/x", "not a number"),
            ("redis://u:p@h", "credentials"),
            ("redis://h?db=1", "query"),
            ("redis://[::1", "unclosed"),
        ] {
            let err = parse_url(url).unwrap_err().to_string();
            assert!(err.contains(url) && err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn replies() {
        let parse = |s: &str| read_reply(&mut s.as_bytes(), 0);
        assert_eq!(parse("+PONG\r\n").unwrap(), Reply::Simple("PONG".into()));
        assert_eq!(parse("-ERR no\r\n").unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(parse(":-3\r\n").unwrap(), Reply::Int(-3));
        assert_eq!(parse("$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(
            parse("$2\r\n12\r\n").unwrap(),
            Reply::Bulk(Some(b"12".to_vec()))
        );
        assert_eq!(
            parse("*2\r\n:1\r\n$0\r\n\r\n").unwrap(),
            Reply::Array(Some(vec![Reply::Int(1), Reply::Bulk(Some(Vec::new()))]))
        );
        assert!(
            parse("HTTP/1.1 400 Bad Request\r\n")
                .unwrap_err()
                .to_string()
                .contains("not a RESP reply")
        );
        assert!(parse("$5\r\n12").is_err());
        assert!(parse("$99999999\r\n").is_err());
        assert_eq!(
            encode(&[b"GET", b"k"]),
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n".to_vec()
        );
    }

    #[test]
    fn drift_saturates() {
        assert_eq!(drift(50, 3), 47);
        assert_eq!(drift(0, 2), -2);
        assert_eq!(drift(-1, u64::MAX), i64::MIN);
    }
}
