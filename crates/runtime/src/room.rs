//! Room given back by the maps that hold an entry for each live agent.
//!
//! A `HashMap` never shrinks by itself: after a burst of a thousand agents
//! it keeps room for two thousand entries, empty, for the life of the
//! daemon (issue 28 measured 3.6 MB kept by the live set alone once 1,000
//! agents had ended). Each such map calls [`give_back`] after a removal.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// Below this much room a map is left alone: small maps cost little, and
/// one that shrank would only grow again at the next few agents.
pub const KEPT_ROOM: usize = 64;

/// Shrinks `map` once it fills less than a quarter of its room, to twice
/// its entries (at least [`KEPT_ROOM`]). A map shrinks only after losing
/// half of what it held since it last grew or shrank, so the copying
/// stays proportional to the removals (amortised constant time each).
pub fn give_back<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    let room = map.capacity();
    if room > KEPT_ROOM && map.len() < room / 4 {
        map.shrink_to((map.len() * 2).max(KEPT_ROOM));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_after_a_burst_gives_its_room_back() {
        let mut m: HashMap<u32, [u8; 1024]> = HashMap::new();
        for i in 0..1000 {
            m.insert(i, [0; 1024]);
        }
        assert!(m.capacity() >= 1000);
        for i in 0..1000 {
            m.remove(&i);
            give_back(&mut m);
        }
        assert!(m.capacity() <= 2 * KEPT_ROOM, "room {}", m.capacity());
    }

    #[test]
    fn a_map_that_stays_full_keeps_its_room() {
        let mut m: HashMap<u32, u32> = (0..1000).map(|i| (i, i)).collect();
        // Half removed: still above a quarter, nothing is given back (a
        // map's room as `capacity` counts it also loses the slots its
        // removals marked, so only "not shrunk" is asserted).
        for i in 0..500 {
            m.remove(&i);
            give_back(&mut m);
        }
        assert!(m.capacity() > 1000, "room {}", m.capacity());
    }
}
