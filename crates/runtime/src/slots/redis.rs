//! The Redis counter: a hash of shares a tenant, spoken to through the `redis`
//! crate's blocking connection, each call one Lua script.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use brood_core::TenantId;
// `::redis` is the crate; this module is `slots::redis`.
use ::redis::{
    Client, Connection, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, RedisResult,
    Script,
};

use super::{DEFAULT_TIMEOUT, DEFAULT_TTL, SlotError, Slots, drift, gone};

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
/// both get it, nor both lose it while it is free. -1 when the tenant's
/// counts were never seeded in this server (KEYS[2] missing): a Redis
/// restarted empty, whose shares say nothing of the agents running.
const ACQUIRE: &str = "\
if redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
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

/// Seeds a tenant's shares after its counts were lost (KEYS[2] missing):
/// holder ARGV[2]'s share is set to ARGV[3] (its own count, exact), and each
/// other holder's (pairs from ARGV[4]) to what the store records running
/// on it, unless that holder wrote its share meanwhile (HSETNX: its own
/// word beats the store's). Then KEYS[2] says the counts are kept, and the
/// hash expires ARGV[1] seconds after this write, as after any other.
const RESEED: &str = "\
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
if ARGV[3] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
end
for i = 4, #ARGV, 2 do
  if ARGV[i + 1] ~= '0' then
    redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
redis.call('SET', KEYS[2], '1')
return 1";

/// The holders of a tenant's shares.
const HOLDERS: &str = "return redis.call('HKEYS', KEYS[1])";

/// Removes the shares of holders ARGV[1..]; returns the slots they held.
const FORGET: &str = "\
local freed = 0
for i = 1, #ARGV do
  freed = freed + (tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') or 0)
  redis.call('HDEL', KEYS[1], ARGV[i])
end
return freed";

/// The scripts, hashed once: [`Script`] sends EVALSHA and, when the server does
/// not know the script yet (a fresh connection's first call, or a restarted
/// Redis), loads it and sends it again, so a call is one round trip once warm
/// instead of shipping the script's text every time.
struct Scripts {
    acquire: Script,
    release: Script,
    count: Script,
    repair: Script,
    holders: Script,
    forget: Script,
    reseed: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            acquire: Script::new(&format!("{SUM}{ACQUIRE}")),
            release: Script::new(RELEASE),
            count: Script::new(&format!("{SUM}return held")),
            repair: Script::new(REPAIR),
            holders: Script::new(HOLDERS),
            forget: Script::new(FORGET),
            reseed: Script::new(RESEED),
        }
    }
}

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
/// The protocol is the `redis` crate's (its blocking [`Connection`], its
/// [`Script`] for EVALSHA with the load on NOSCRIPT); the URL is read here, so
/// that the forms brood supports, and those it refuses by name, stay the same
/// whatever the crate would also accept.
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
    client: Client,
    scripts: Scripts,
    conn: Mutex<Option<Connection>>,
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
        let client = (addr.host.clone(), addr.port)
            .into_connection_info()
            .map(|info| {
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_db(i64::from(addr.db))
                    // CLIENT SETINFO would be one more round trip at every
                    // (re)connect, which the dispatcher waits for.
                    .set_skip_set_lib_name();
                info.set_redis_settings(settings)
            })
            .and_then(Client::open)
            .map_err(|e| SlotError::Url {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        let redis = Redis {
            url: url.to_owned(),
            addr,
            holder: holder.to_owned(),
            ttl: DEFAULT_TTL,
            timeout: DEFAULT_TIMEOUT,
            client,
            scripts: Scripts::new(),
            conn: Mutex::new(None),
        };
        let pong: String = redis.call("PING", |c| ::redis::cmd("PING").query(c))?;
        if pong != "PONG" {
            return Err(redis.error("PING", format!("answered {pong:?}, not PONG")));
        }
        Ok(redis)
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

    /// The Redis key that says `tenant`'s shares were seeded in this server
    /// ([`Slots::reseed`]); a Redis restarted empty has none, and its
    /// counts are then known to be lost rather than taken for none held.
    pub fn seeded_key(tenant: &TenantId) -> String {
        format!("brood:slots:{tenant}:seeded")
    }

    fn ttl_secs(&self) -> u64 {
        self.ttl.as_secs().max(1)
    }

    fn error(&self, command: &'static str, detail: impl Into<String>) -> SlotError {
        SlotError::Redis {
            url: self.url.clone(),
            command,
            detail: detail.into(),
        }
    }

    fn conn(&self) -> MutexGuard<'_, Option<Connection>> {
        // A lock poisoned by a panic mid-command may hold a connection with half
        // a reply unread; dropping it is enough to recover.
        match self.conn.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                let mut guard = poisoned.into_inner();
                *guard = None;
                guard
            }
        }
    }

    /// Runs one exchange (`run`, a command or a script) on the connection,
    /// replacing a broken one once. `command` names it in errors. An error reply
    /// from the server is an error here too.
    fn call<T>(
        &self,
        command: &'static str,
        run: impl Fn(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, SlotError> {
        let mut slot = self.conn();
        let reused = slot.is_some();
        let mut conn = match slot.take() {
            Some(conn) => conn,
            None => self.open_conn(command)?,
        };
        let result = match run(&mut conn) {
            Err(e) if reused && is_gone(&e) => {
                // The connection died while idle (the server restarted or closed
                // it), so the command almost surely never ran and is sent again
                // on a fresh one. In the rare case it did run before the reset,
                // the count is one off until the reconciler's next pass repairs
                // it.
                tracing::debug!(url = %self.url, error = %e, "redis connection lost; reconnecting");
                conn = self.open_conn(command)?;
                run(&mut conn)
            }
            result => result,
        };
        match result {
            Ok(value) => {
                *slot = Some(conn);
                Ok(value)
            }
            Err(e) => {
                // Only a connection that finished its exchange goes back for
                // reuse: after a timeout or a cut reply the next reply on it
                // could be this one's.
                if is_answer(&e) {
                    *slot = Some(conn);
                }
                Err(self.error(command, describe(&e, self.timeout)))
            }
        }
    }

    /// Connects (trying each resolved address, within the timeout), selects the
    /// database and sets the timeouts for every later exchange.
    fn open_conn(&self, command: &'static str) -> Result<Connection, SlotError> {
        let conn = self
            .client
            .get_connection_with_timeout(self.timeout)
            .map_err(|e| {
                // With no credentials and no client name, the only command the
                // crate sends while connecting is SELECT: an answer refusing
                // something is its.
                if self.addr.db != 0 && is_answer(&e) {
                    self.error("SELECT", format!("database {}: {e}", self.addr.db))
                } else if e.is_timeout() {
                    self.error(
                        command,
                        format!(
                            "no answer from {}:{} within the timeout ({:?}) while connecting: {e}",
                            self.addr.host, self.addr.port, self.timeout
                        ),
                    )
                } else if e.kind() == ErrorKind::Parse {
                    self.error(command, describe(&e, self.timeout))
                } else {
                    self.error(
                        command,
                        format!(
                            "cannot connect to {}:{}: {e}",
                            self.addr.host, self.addr.port
                        ),
                    )
                }
            })?;
        let setup =
            |e: RedisError| self.error(command, format!("cannot set up the connection: {e}"));
        conn.set_read_timeout(Some(self.timeout)).map_err(setup)?;
        conn.set_write_timeout(Some(self.timeout)).map_err(setup)?;
        Ok(conn)
    }

    /// Runs `script` on `key` with `args`.
    fn eval<T: FromRedisValue>(
        &self,
        command: &'static str,
        script: &Script,
        key: &str,
        args: &[&str],
    ) -> Result<T, SlotError> {
        self.call(command, |c| script.key(key).arg(args).invoke(c))
    }
}

impl Slots for Redis {
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError> {
        let got: i64 = self.call("EVAL acquire", |c| {
            self.scripts
                .acquire
                .key(Redis::key(tenant))
                .key(Redis::seeded_key(tenant))
                .arg(max)
                .arg(self.ttl_secs())
                .arg(&self.holder)
                .invoke(c)
        })?;
        if got < 0 {
            return Err(SlotError::Lost {
                url: self.url.clone(),
            });
        }
        Ok(got == 1)
    }

    fn reseed(
        &self,
        tenant: &TenantId,
        mine: u64,
        others: &[(String, u64)],
    ) -> Result<(), SlotError> {
        let _: i64 = self.call("EVAL reseed", |c| {
            let mut s = self.scripts.reseed.key(Redis::key(tenant));
            s.key(Redis::seeded_key(tenant))
                .arg(self.ttl_secs())
                .arg(&self.holder)
                .arg(mine);
            for (holder, n) in others.iter().filter(|(h, _)| *h != self.holder) {
                s.arg(holder).arg(*n);
            }
            s.invoke(c)
        })?;
        Ok(())
    }

    fn release(&self, tenant: &TenantId) -> Result<(), SlotError> {
        let _share: i64 = self.eval(
            "EVAL release",
            &self.scripts.release,
            &Redis::key(tenant),
            &[&self.ttl_secs().to_string(), &self.holder],
        )?;
        Ok(())
    }

    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError> {
        let held: i64 = self.eval("EVAL count", &self.scripts.count, &Redis::key(tenant), &[])?;
        // A negative share means more releases than acquires were recorded:
        // as far as the counter knows nothing is held. The reconciler repairs
        // the share itself.
        Ok(u64::try_from(held).unwrap_or(0))
    }

    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError> {
        let old: i64 = self.eval(
            "EVAL repair",
            &self.scripts.repair,
            &Redis::key(tenant),
            &[
                &actual.to_string(),
                &self.ttl_secs().to_string(),
                &self.holder,
            ],
        )?;
        Ok(drift(old, actual))
    }

    fn forget_holders(
        &self,
        tenant: &TenantId,
        alive: &dyn Fn(&str) -> bool,
    ) -> Result<u64, SlotError> {
        let key = Redis::key(tenant);
        let holders: Vec<String> = self.eval("EVAL holders", &self.scripts.holders, &key, &[])?;
        let gone = gone(holders.iter().map(String::as_str), &self.holder, alive);
        if gone.is_empty() {
            return Ok(0);
        }
        let freed: i64 = self.eval("EVAL forget", &self.scripts.forget, &key, &gone)?;
        Ok(u64::try_from(freed).unwrap_or(0))
    }

    fn describe(&self) -> String {
        format!("redis at {}", self.url)
    }
}

/// The connection was already dead when the command was sent: the write
/// failed, or the server had closed it (end of file, a reset; the crate's
/// judgement). The command almost surely did not run, so it may be sent again
/// on a fresh one.
fn is_gone(e: &RedisError) -> bool {
    e.is_connection_dropped()
}

/// The server answered, with an error or a value of another type than asked:
/// the exchange is complete and the connection still in step.
fn is_answer(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType
    )
}

/// What went wrong, for the detail of a [`SlotError::Redis`].
fn describe(e: &RedisError, timeout: Duration) -> String {
    if e.is_timeout() {
        format!("no reply within the timeout ({timeout:?}): {e}")
    } else if is_gone(e) {
        format!("connection lost: {e}")
    } else if e.kind() == ErrorKind::Parse {
        // The parser's message spans lines (one a token it did not expect);
        // an error is one line in a log.
        let parse = e.to_string();
        let parse = parse.split_whitespace().collect::<Vec<_>>().join(" ");
        format!("not a RESP reply; is this a Redis server? ({parse})")
    } else if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) {
        format!("server replied: {e}")
    } else if e.kind() == ErrorKind::UnexpectedReturnType {
        format!("unexpected reply: {e}")
    } else {
        e.to_string()
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

#[cfg(test)]
mod tests {
    use super::{Addr, parse_url};

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
}
