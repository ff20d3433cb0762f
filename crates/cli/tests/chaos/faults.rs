//! The faults, injected at random between the driver's steps and healed
//! after a random while (or at the round's end): a node killed (SIGKILL,
//! started again at the heal), a node stopped (SIGSTOP, then SIGCONT),
//! PostgreSQL's backends terminated, PostgreSQL restarted (stopped as a
//! crash would, started at the heal), the proxy adding latency, dropping
//! every connection, or black-holing (then, at the heal, the network back
//! and, most times, its connections reset), Redis restarted (empty: it keeps
//! nothing), and the roots' filesystem full.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::report::Report;
use crate::rng::Rng;
use crate::sampler::{LOST_SETTLE, REDIS_SETTLE, Shared};
use crate::world::World;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kill,
    Pause,
    PgTerminate,
    PgRestart,
    Latency,
    Drop,
    Blackhole,
    RedisRestart,
    DiskFull,
}

pub const KINDS: [Kind; 9] = [
    Kind::Kill,
    Kind::Pause,
    Kind::PgTerminate,
    Kind::PgRestart,
    Kind::Latency,
    Kind::Drop,
    Kind::Blackhole,
    Kind::RedisRestart,
    Kind::DiskFull,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "node SIGKILL",
            Kind::Pause => "node SIGSTOP",
            Kind::PgTerminate => "pg backends terminated",
            Kind::PgRestart => "pg restarted",
            Kind::Latency => "proxy latency",
            Kind::Drop => "proxy drops connections",
            Kind::Blackhole => "proxy black-hole",
            Kind::RedisRestart => "redis restarted",
            Kind::DiskFull => "filesystem full",
        }
    }
}

struct Active {
    kind: Kind,
    node: Option<usize>,
    until: Instant,
    /// For a black-hole: whether its connections are reset when it ends.
    reset: bool,
}

/// An hour: "until healed" for a disturbance window.
const UNTIL_HEALED: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub struct Faults {
    active: Vec<Active>,
}

impl Faults {
    fn is_active(&self, k: Kind) -> bool {
        self.active.iter().any(|a| a.kind == k)
    }

    fn feasible(&self, k: Kind, world: &World) -> bool {
        let usable = world.usable().len();
        match k {
            // One node is always left to drive the cluster through.
            Kind::Kill | Kind::Pause => usable >= 2,
            Kind::PgTerminate => !world.pg.down,
            Kind::PgRestart => !world.pg.down,
            Kind::RedisRestart => world.redis.up(),
            Kind::Drop => true,
            Kind::Latency | Kind::Blackhole | Kind::DiskFull => !self.is_active(k),
        }
    }

    /// Injects one fault: a kind this campaign has not injected yet if one
    /// can be, else any that can be.
    pub fn inject(
        &mut self,
        world: &mut World,
        rng: &mut Rng,
        report: &mut Report,
        sh: &Arc<Shared>,
    ) {
        let fresh: Vec<Kind> = KINDS
            .iter()
            .copied()
            .filter(|k| !report.faults.contains_key(k.name()) && self.feasible(*k, world))
            .collect();
        let any: Vec<Kind> = KINDS
            .iter()
            .copied()
            .filter(|k| self.feasible(*k, world))
            .collect();
        let Some(&kind) = rng.pick(if fresh.is_empty() { &any } else { &fresh }) else {
            return;
        };
        let now = Instant::now();
        let mut active = Active {
            kind,
            node: None,
            until: now,
            reset: false,
        };
        match kind {
            Kind::Kill | Kind::Pause => {
                let usable = world.usable();
                let Some(&n) = rng.pick(&usable) else { return };
                active.node = Some(n);
                if kind == Kind::Kill {
                    world.nodes[n].kill();
                    active.until = now + Duration::from_millis(rng.between(300, 3000));
                } else {
                    world.nodes[n].pause();
                    Shared::disturb(&sh.lost_until, now + UNTIL_HEALED);
                    active.until = now + Duration::from_millis(rng.between(1000, 7000));
                }
            }
            Kind::PgTerminate => {
                // Terminated whatever it answers: how many is not checked.
                let _ = world.pg.terminate_backends();
            }
            Kind::PgRestart => {
                world.pg.server.stop_hard();
                world.pg.down = true;
                active.until = now + Duration::from_millis(rng.between(300, 3000));
            }
            Kind::Latency => {
                world
                    .pg
                    .proxy
                    .set_latency(Duration::from_millis(rng.between(20, 200)));
                active.until = now + Duration::from_millis(rng.between(2000, 5000));
            }
            Kind::Drop => {
                world.pg.proxy.drop_connections();
            }
            Kind::Blackhole => {
                world.pg.proxy.go_silent(true);
                active.reset = rng.chance(0.7);
                active.until = now + Duration::from_millis(rng.between(1000, 3000));
            }
            Kind::RedisRestart => {
                world.redis.stop();
                Shared::disturb(&sh.redis_until, now + UNTIL_HEALED);
                sh.redis_drain
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                active.until = now + Duration::from_millis(rng.between(300, 3000));
            }
            Kind::DiskFull => {
                world.fill_disk();
                active.until = now + Duration::from_millis(rng.between(1000, 4000));
            }
        }
        *report.faults.entry(kind.name()).or_default() += 1;
        let on = active
            .node
            .map(|n| format!(" (node {n})"))
            .unwrap_or_default();
        println!(
            "chaos {}: round {} fault: {}{on}",
            report.label,
            sh.round.load(std::sync::atomic::Ordering::SeqCst),
            kind.name()
        );
        if active.until > now {
            self.active.push(active);
        }
        sync_usable(world, sh);
    }

    /// Heals what is due (or everything, `all`): the store, the network,
    /// Redis and the disk before the nodes, since a node started again needs
    /// them. A node that does not start again is a violation.
    pub fn heal(
        &mut self,
        world: &mut World,
        report: &Report,
        round: usize,
        sh: &Arc<Shared>,
        all: bool,
    ) {
        let now = Instant::now();
        let due: Vec<Active>;
        (due, self.active) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| all || a.until <= now);
        let (infra, nodes): (Vec<Active>, Vec<Active>) =
            due.into_iter().partition(|a| a.node.is_none());
        for a in infra {
            match a.kind {
                Kind::PgRestart => {
                    world.pg.server.start();
                    world.pg.down = false;
                }
                Kind::Latency => world.pg.proxy.set_latency(Duration::ZERO),
                Kind::Blackhole => {
                    world.pg.proxy.go_silent(false);
                    if a.reset {
                        world.pg.proxy.drop_connections();
                    }
                }
                Kind::RedisRestart => {
                    if let Err(e) = world.redis.start() {
                        report.violation(round, "redis started again", e);
                    }
                    Shared::disturb(&sh.redis_until, Instant::now() + REDIS_SETTLE);
                }
                Kind::DiskFull => world.free_disk(),
                _ => {}
            }
        }
        let store_away =
            world.pg.down || self.is_active(Kind::Blackhole) || self.is_active(Kind::DiskFull);
        for a in nodes {
            let Some(n) = a.node else { continue };
            match a.kind {
                // A node started while its store is away only fails: later.
                // So does one started while Redis is away: it waits for
                // Redis (`slots::START_WAIT`), but this campaign would heal
                // Redis only after the start returned, so it would wait in
                // vain (seed 1795700155035860712, round 11).
                Kind::Kill if store_away || !world.redis.up() => self.active.push(Active {
                    until: now + Duration::from_millis(500),
                    ..a
                }),
                Kind::Kill => {
                    if let Err(e) = world.nodes[n].start() {
                        report.violation(round, "node started again after SIGKILL", e);
                    }
                }
                Kind::Pause => {
                    world.nodes[n].resume();
                    if !self.is_active(Kind::Pause) {
                        Shared::disturb(&sh.lost_until, Instant::now() + LOST_SETTLE);
                    }
                }
                _ => {}
            }
        }
        sync_usable(world, sh);
    }
}

pub fn sync_usable(world: &World, sh: &Shared) {
    let u: Vec<bool> = world.nodes.iter().map(|n| n.usable()).collect();
    *sh.usable.lock().unwrap_or_else(|p| p.into_inner()) = u;
}
