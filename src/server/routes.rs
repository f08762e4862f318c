//! Who a targeted message reaches: the connections of each client id and
//! the subscribers of each channel, indexed so that a message costs
//! O(its recipients), never a scan of the connections, and a connection
//! with no id and no channel costs nothing here.
//!
//! The indexes are `hashbrown` tables of small fixed-size entries whose
//! keys live elsewhere: a connection's id stays in its request target
//! (the table keeps the connection's slot and the id's hash, and asks the
//! caller for the id to confirm a match), so an id costs one 8-byte entry,
//! and a subscription an 8-byte entry plus its place in the channel's list.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use slab::Slab;

/// A connection's slot in the loop's slab.
pub type Slot = u32;

/// A connection holding a client id: its slot and the id's hash.
#[derive(Debug, Clone, Copy)]
struct Holder {
    slot: Slot,
    id_hash: u32,
}

/// One subscription: a connection and a channel (an index into `channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Membership {
    slot: Slot,
    channel: u32,
}

/// A channel with at least one subscriber.
#[derive(Debug)]
struct Channel {
    name: Box<str>,
    subscribers: Vec<Slot>,
}

/// Subscribing would make more channels than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLimit;

/// The indexes of one loop.
#[derive(Debug)]
pub struct Routes {
    hasher: RandomState,
    holders: HashTable<Holder>,
    /// Channel indexes, by the channel name's hash.
    names: HashTable<u32>,
    channels: Slab<Channel>,
    /// Every subscription, by its connection's hash: a connection's are
    /// found together.
    memberships: HashTable<Membership>,
    max_channels: usize,
}

/// Spreads a 32-bit value over a 64-bit table hash (the table takes its
/// buckets from the low bits and its tags from the top ones).
fn spread(value: u32) -> u64 {
    u64::from(value).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Routes {
    /// Empty indexes allowing at most `max_channels` channels at once.
    pub fn new(max_channels: usize) -> Routes {
        Routes {
            hasher: RandomState::new(),
            holders: HashTable::new(),
            names: HashTable::new(),
            channels: Slab::new(),
            memberships: HashTable::new(),
            max_channels,
        }
    }

    fn id_hash(&self, id: &str) -> u32 {
        self.hasher.hash_one(id) as u32
    }

    /// Records that connection `slot` holds client id `id`.
    pub fn add_id(&mut self, slot: Slot, id: &str) {
        let id_hash = self.id_hash(id);
        self.holders
            .insert_unique(spread(id_hash), Holder { slot, id_hash }, |h| {
                spread(h.id_hash)
            });
    }

    /// The connections holding `id`; `id_of` gives a connection's id, to
    /// tell apart ids whose hashes collide.
    pub fn holders<'a, 'f>(
        &'a self,
        id: &'a str,
        id_of: impl Fn(Slot) -> Option<&'f str> + 'a,
    ) -> impl Iterator<Item = Slot> + 'a {
        let id_hash = self.id_hash(id);
        self.holders
            .iter_hash(spread(id_hash))
            .filter(move |h| h.id_hash == id_hash && id_of(h.slot) == Some(id))
            .map(|h| h.slot)
    }

    /// The channels subscribed to now.
    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }

    /// The subscriptions held now.
    pub fn subscription_count(&self) -> usize {
        self.memberships.len()
    }

    /// The connections with a client id now.
    pub fn id_count(&self) -> usize {
        self.holders.len()
    }

    /// Whether `more` new channels would go over the limit.
    fn over_limit(&self, more: usize) -> bool {
        self.channels.len() + more > self.max_channels
    }

    fn channel(&self, name: &str) -> Option<u32> {
        let channels = &self.channels;
        self.names
            .find(self.hasher.hash_one(name), |&i| {
                &*channels[i as usize].name == name
            })
            .copied()
    }

    /// The subscribers of `name` (none if nobody is subscribed).
    pub fn subscribers(&self, name: &str) -> &[Slot] {
        self.channel(name)
            .map_or(&[], |i| &self.channels[i as usize].subscribers)
    }

    /// Subscribes `slot` to `name`; `Ok(false)` if it already was.
    pub fn subscribe(&mut self, slot: Slot, name: &str) -> Result<bool, ChannelLimit> {
        let channel = match self.channel(name) {
            Some(channel) => channel,
            None if self.over_limit(1) => return Err(ChannelLimit),
            None => {
                let index = self.channels.insert(Channel {
                    name: name.into(),
                    subscribers: Vec::new(),
                }) as u32;
                let channels = &self.channels;
                let hasher = &self.hasher;
                self.names
                    .insert_unique(hasher.hash_one(name), index, |&i| {
                        hasher.hash_one(&*channels[i as usize].name)
                    });
                index
            }
        };
        let membership = Membership { slot, channel };
        let hash = spread(slot);
        if self.memberships.find(hash, |m| *m == membership).is_some() {
            return Ok(false);
        }
        self.memberships
            .insert_unique(hash, membership, |m| spread(m.slot));
        self.channels[channel as usize].subscribers.push(slot);
        Ok(true)
    }

    /// Unsubscribes `slot` from `name`; `false` if it was not subscribed.
    pub fn unsubscribe(&mut self, slot: Slot, name: &str) -> bool {
        let Some(channel) = self.channel(name) else {
            return false;
        };
        let membership = Membership { slot, channel };
        match self
            .memberships
            .find_entry(spread(slot), |m| *m == membership)
        {
            Ok(entry) => entry.remove(),
            Err(_) => return false,
        };
        self.drop_subscriber(channel, slot);
        true
    }

    /// Takes `slot` out of every channel and, if it held `id`, out of the
    /// id's holders: its connection closed.
    pub fn leave(&mut self, slot: Slot, id: Option<&str>) {
        if let Some(id) = id {
            let id_hash = self.id_hash(id);
            if let Ok(entry) = self
                .holders
                .find_entry(spread(id_hash), |h| h.slot == slot && h.id_hash == id_hash)
            {
                entry.remove();
            }
        }
        let hash = spread(slot);
        while let Ok(entry) = self.memberships.find_entry(hash, |m| m.slot == slot) {
            let (membership, _) = entry.remove();
            self.drop_subscriber(membership.channel, slot);
        }
    }

    /// Removes `slot` from a channel's list, and the channel once empty.
    fn drop_subscriber(&mut self, channel: u32, slot: Slot) {
        let subscribers = &mut self.channels[channel as usize].subscribers;
        if let Some(at) = subscribers.iter().position(|&s| s == slot) {
            subscribers.swap_remove(at);
        }
        if subscribers.is_empty() {
            let removed = self.channels.remove(channel as usize);
            let hash = self.hasher.hash_one(&*removed.name);
            if let Ok(entry) = self.names.find_entry(hash, |&i| i == channel) {
                entry.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(slots: impl IntoIterator<Item = Slot>) -> Vec<Slot> {
        let mut v: Vec<Slot> = slots.into_iter().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn ids_find_every_holder_and_only_theirs() {
        let mut routes = Routes::new(10);
        let ids = ["alice", "bob", "alice", "carol", "alice"];
        for (slot, id) in ids.iter().enumerate() {
            routes.add_id(slot as Slot, id);
        }
        let id_of = |slot: Slot| ids.get(slot as usize).copied();
        assert_eq!(sorted(routes.holders("alice", id_of)), [0, 2, 4]);
        assert_eq!(sorted(routes.holders("bob", id_of)), [1]);
        assert_eq!(sorted(routes.holders("dave", id_of)), Vec::<Slot>::new());
        routes.leave(2, Some("alice"));
        assert_eq!(sorted(routes.holders("alice", id_of)), [0, 4]);
        assert_eq!(routes.id_count(), 4);
    }

    #[test]
    fn an_id_whose_hash_collides_is_told_apart() {
        let mut routes = Routes::new(10);
        // Two holders entered under the same hash, as a collision would.
        let id_hash = routes.id_hash("alice");
        for slot in [1, 2] {
            routes
                .holders
                .insert_unique(spread(id_hash), Holder { slot, id_hash }, |h| {
                    spread(h.id_hash)
                });
        }
        let id_of = |slot: Slot| Some(if slot == 1 { "alice" } else { "mallory" });
        assert_eq!(sorted(routes.holders("alice", id_of)), [1]);
    }

    #[test]
    fn subscriptions_come_and_go_with_their_channels() {
        let mut routes = Routes::new(2);
        assert_eq!(routes.subscribe(1, "news"), Ok(true));
        assert_eq!(routes.subscribe(1, "news"), Ok(false), "once");
        assert_eq!(routes.subscribe(2, "news"), Ok(true));
        assert_eq!(routes.subscribe(2, "chat"), Ok(true));
        assert_eq!(
            routes.subscribe(3, "sport"),
            Err(ChannelLimit),
            "two at most"
        );
        assert_eq!(sorted(routes.subscribers("news").iter().copied()), [1, 2]);
        assert!(routes.unsubscribe(1, "news"));
        assert!(!routes.unsubscribe(1, "news"));
        assert!(!routes.unsubscribe(1, "nothing"));
        assert_eq!(routes.subscribers("news"), [2]);
        routes.leave(2, None);
        assert_eq!(routes.channel_count(), 0, "empty channels are dropped");
        assert_eq!(routes.subscription_count(), 0);
        assert_eq!(routes.subscribers("news"), [] as [Slot; 0]);
        assert_eq!(routes.subscribe(3, "sport"), Ok(true), "room again");
    }

    #[test]
    fn many_connections_and_channels_stay_consistent() {
        let mut routes = Routes::new(1000);
        for slot in 0..500u32 {
            for c in 0..(slot % 7) {
                routes.subscribe(slot, &format!("c{c}")).unwrap();
            }
        }
        for slot in (0..500u32).step_by(3) {
            routes.leave(slot, None);
        }
        for c in 0..7u32 {
            let want: Vec<Slot> = (0..500).filter(|s| s % 3 != 0 && s % 7 > c).collect();
            assert_eq!(
                sorted(routes.subscribers(&format!("c{c}")).iter().copied()),
                want,
                "c{c}"
            );
        }
    }
}
