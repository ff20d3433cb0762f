//! brood-launch: the only place brood starts processes.
//!
//! * [`cgroup`]: create, kill, confirm empty and remove the groups that contain each
//!   agent's whole process tree (cgroup v2, hybrid and v1 behind one interface).
//! * [`spawn`]: the spawner thread, the PID-namespace keeper, and the fork/exec path
//!   that puts a child in its group before it runs a single instruction of its own.
//! * [`env`]: the environment built from nothing.
//! * [`floor`]: the bare baselines `brood bench` compares against.
//! * [`host`]: what this host offers (for `brood doctor` and start-up decisions).
//! * [`sandbox`]: kernel enforcement of a policy (landlock, `no_new_privs`,
//!   capabilities dropped), prepared in the supervisor and applied in the child.
//! * [`veil`]: brood's own machinery (cgroup hierarchies, `$BROOD_ROOT`, the
//!   store's files) covered in each agent's mount namespace, whatever its policy.
//! * [`written`]: the bytes an agent's processes wrote to disk (its write budget).
//!
//! **Invariant:** no other crate calls `Command::new` (enforced by `clippy.toml`).

pub mod cgroup;
pub mod confine;
pub mod env;
pub mod floor;
pub mod host;
pub mod ns;
pub mod sandbox;
pub mod spawn;
pub mod veil;
pub mod written;

pub use spawn::{Containment, KeeperWatch, LaunchError, LaunchSpec, Launched, Spawner};
