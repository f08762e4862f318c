//! Who a targeted message reaches: the connections of each client id and
//! the subscribers of each channel, indexed so that a message costs
//! O(its recipients), never a scan of the connections, and a connection
//! with no id and no channel costs nothing here.
//!
//! The indexes are `hashbrown` tables of small fixed-size entries whose
//! keys live elsewhere. A connection with an id or a channel has one
//! 12-byte record: its slot, its id's hash (the id stays in its request
//! target; the caller gives it to confirm a match) and its first channel.
//! Each further channel is an 8-byte entry in a second table, and every
//! subscription is 4 bytes in its channel's list.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use slab::Slab;

/// A connection's slot in the loop's slab.
pub type Slot = u32;

/// No channel, in [`Member::channel`].
const NONE: u32 = u32::MAX;

/// A connection with an id or a channel.
#[derive(Debug, Clone, Copy)]
struct Member {
    slot: Slot,
    /// The id's hash if it has an id, else its slot: what the record is
    /// filed under.
    filed: u32,
    /// Its first channel (an index into `channels`), or [`NONE`].
    channel: u32,
}

/// A further channel of a connection.
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
    /// Connections with an id or a channel, by `filed`.
    members: HashTable<Member>,
    /// Channel indexes, by the channel name's hash.
    names: HashTable<u32>,
    channels: Slab<Channel>,
    /// Channels beyond a connection's first, by its slot.
    more: HashTable<Membership>,
    /// Connections with an id.
    ids: usize,
    /// Subscriptions, over all channels.
    subscriptions: usize,
    /// A table or a list moved to a larger allocation since the last
    /// [`Routes::take_grown`].
    grown: bool,
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
            members: HashTable::new(),
            names: HashTable::new(),
            channels: Slab::new(),
            more: HashTable::new(),
            ids: 0,
            subscriptions: 0,
            grown: false,
            max_channels,
        }
    }

    fn id_hash(&self, id: &str) -> u32 {
        self.hasher.hash_one(id) as u32
    }

    /// What connection `slot`'s record is filed under.
    fn filed(&self, slot: Slot, id: Option<&str>) -> u32 {
        id.map_or(slot, |id| self.id_hash(id))
    }

    /// The connections holding `id`; `id_of` gives a connection's id, to
    /// tell apart ids whose hashes collide (and connections without one).
    pub fn holders<'a, 'f>(
        &'a self,
        id: &'a str,
        id_of: impl Fn(Slot) -> Option<&'f str> + 'a,
    ) -> impl Iterator<Item = Slot> + 'a {
        let id_hash = self.id_hash(id);
        self.members
            .iter_hash(spread(id_hash))
            .filter(move |m| m.filed == id_hash && id_of(m.slot) == Some(id))
            .map(|m| m.slot)
    }

    /// The channels subscribed to now.
    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }

    /// The subscriptions held now.
    pub fn subscription_count(&self) -> usize {
        self.subscriptions
    }

    /// The connections with a client id now.
    pub fn id_count(&self) -> usize {
        self.ids
    }

    /// Whether a table or a list grew (leaving its old allocation free)
    /// since the last call.
    pub fn take_grown(&mut self) -> bool {
        std::mem::take(&mut self.grown)
    }

    /// Notes a growth when `after` is more than `before` (capacities).
    fn note(&mut self, before: usize, after: usize) {
        self.grown |= after > before;
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

    /// The channel named `name`, made if it does not exist yet.
    fn channel_or_new(&mut self, name: &str) -> Result<u32, ChannelLimit> {
        if let Some(channel) = self.channel(name) {
            return Ok(channel);
        }
        if self.over_limit(1) {
            return Err(ChannelLimit);
        }
        let index = self.channels.insert(Channel {
            name: name.into(),
            subscribers: Vec::new(),
        }) as u32;
        let channels = &self.channels;
        let hasher = &self.hasher;
        let before = self.names.capacity();
        self.names
            .insert_unique(hasher.hash_one(name), index, |&i| {
                hasher.hash_one(&*channels[i as usize].name)
            });
        self.note(before, self.names.capacity());
        Ok(index)
    }

    /// The subscribers of `name` (none if nobody is subscribed).
    pub fn subscribers(&self, name: &str) -> &[Slot] {
        self.channel(name)
            .map_or(&[], |i| &self.channels[i as usize].subscribers)
    }

    /// Enters a connection that just upgraded with client id `id` (if
    /// any); it has no channel yet.
    pub fn join(&mut self, slot: Slot, id: Option<&str>) {
        if id.is_none() {
            return;
        }
        self.ids += 1;
        let member = Member {
            slot,
            filed: self.filed(slot, id),
            channel: NONE,
        };
        self.add_member(member);
    }

    fn add_member(&mut self, member: Member) {
        let before = self.members.capacity();
        self.members
            .insert_unique(spread(member.filed), member, |m| spread(m.filed));
        self.note(before, self.members.capacity());
    }

    fn member(&mut self, slot: Slot, id: Option<&str>) -> Option<&mut Member> {
        let filed = self.filed(slot, id);
        self.members
            .find_mut(spread(filed), |m| m.slot == slot && m.filed == filed)
    }

    /// Subscribes `slot` (with client id `id`) to `name`; `Ok(false)` if it
    /// already was.
    pub fn subscribe(
        &mut self,
        slot: Slot,
        id: Option<&str>,
        name: &str,
    ) -> Result<bool, ChannelLimit> {
        let channel = self.channel_or_new(name)?;
        let membership = Membership { slot, channel };
        let hash = spread(slot);
        let in_more = self.more.find(hash, |m| *m == membership).is_some();
        match self.member(slot, id) {
            Some(member) if member.channel == channel || in_more => return Ok(false),
            Some(member) if member.channel == NONE => member.channel = channel,
            Some(_) => {
                let before = self.more.capacity();
                self.more
                    .insert_unique(hash, membership, |m| spread(m.slot));
                self.note(before, self.more.capacity());
            }
            None => {
                self.ids += usize::from(id.is_some());
                let member = Member {
                    slot,
                    filed: self.filed(slot, id),
                    channel,
                };
                self.add_member(member);
            }
        }
        let subscribers = &mut self.channels[channel as usize].subscribers;
        let before = subscribers.capacity();
        subscribers.push(slot);
        let after = subscribers.capacity();
        self.note(before, after);
        self.subscriptions += 1;
        Ok(true)
    }

    /// Unsubscribes `slot` (with client id `id`) from `name`; `false` if it
    /// was not subscribed.
    pub fn unsubscribe(&mut self, slot: Slot, id: Option<&str>, name: &str) -> bool {
        let Some(channel) = self.channel(name) else {
            return false;
        };
        let membership = Membership { slot, channel };
        match self.member(slot, id) {
            Some(member) if member.channel == channel => member.channel = NONE,
            Some(_) => match self.more.find_entry(spread(slot), |m| *m == membership) {
                Ok(entry) => drop(entry.remove()),
                Err(_) => return false,
            },
            None => return false,
        }
        self.drop_subscriber(channel, slot);
        if id.is_none() {
            self.forget_if_bare(slot);
        }
        true
    }

    /// Drops the record of a connection without an id once it has no
    /// channel left, so that it costs nothing again.
    fn forget_if_bare(&mut self, slot: Slot) {
        let hash = spread(slot);
        let has_more = self.more.find(hash, |m| m.slot == slot).is_some();
        if let Ok(entry) = self
            .members
            .find_entry(hash, |m| m.slot == slot && m.filed == slot)
        {
            if entry.get().channel == NONE && !has_more {
                entry.remove();
            }
        }
    }

    /// Takes `slot` (with client id `id`) out of every channel and out of
    /// the id's holders: its connection closed.
    pub fn leave(&mut self, slot: Slot, id: Option<&str>) {
        let filed = self.filed(slot, id);
        let Ok(entry) = self
            .members
            .find_entry(spread(filed), |m| m.slot == slot && m.filed == filed)
        else {
            return;
        };
        let (member, _) = entry.remove();
        if id.is_some() {
            self.ids -= 1;
        }
        if member.channel != NONE {
            self.drop_subscriber(member.channel, slot);
        }
        let hash = spread(slot);
        while let Ok(entry) = self.more.find_entry(hash, |m| m.slot == slot) {
            let (membership, _) = entry.remove();
            self.drop_subscriber(membership.channel, slot);
        }
    }

    /// Removes `slot` from a channel's list, and the channel once empty.
    fn drop_subscriber(&mut self, channel: u32, slot: Slot) {
        let subscribers = &mut self.channels[channel as usize].subscribers;
        if let Some(at) = subscribers.iter().position(|&s| s == slot) {
            subscribers.swap_remove(at);
            self.subscriptions -= 1;
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
            routes.join(slot as Slot, Some(id));
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
        // Two holders entered under the same hash, as a collision would,
        // and a connection without an id whose slot is that hash.
        let id_hash = routes.id_hash("alice");
        for slot in [1, 2, id_hash] {
            let member = Member {
                slot,
                filed: id_hash,
                channel: NONE,
            };
            routes
                .members
                .insert_unique(spread(id_hash), member, |m| spread(m.filed));
        }
        let id_of = |slot: Slot| match slot {
            1 => Some("alice"),
            2 => Some("mallory"),
            _ => None,
        };
        assert_eq!(sorted(routes.holders("alice", id_of)), [1]);
    }

    #[test]
    fn subscriptions_come_and_go_with_their_channels() {
        let mut routes = Routes::new(2);
        assert_eq!(routes.subscribe(1, None, "news"), Ok(true));
        assert_eq!(routes.subscribe(1, None, "news"), Ok(false), "once");
        assert_eq!(routes.subscribe(2, None, "news"), Ok(true));
        assert_eq!(routes.subscribe(2, None, "chat"), Ok(true));
        assert_eq!(
            routes.subscribe(3, None, "sport"),
            Err(ChannelLimit),
            "two at most"
        );
        assert_eq!(sorted(routes.subscribers("news").iter().copied()), [1, 2]);
        assert!(routes.unsubscribe(1, None, "news"));
        assert!(!routes.unsubscribe(1, None, "news"));
        assert!(!routes.unsubscribe(1, None, "nothing"));
        assert_eq!(routes.subscribers("news"), [2]);
        routes.leave(2, None);
        assert_eq!(routes.channel_count(), 0, "empty channels are dropped");
        assert_eq!(routes.subscription_count(), 0);
        assert_eq!(routes.subscribers("news"), [] as [Slot; 0]);
        assert_eq!(routes.subscribe(3, None, "sport"), Ok(true), "room again");
    }

    #[test]
    fn a_connection_is_in_a_channel_once_however_it_got_there() {
        let mut routes = Routes::new(10);
        routes.join(7, Some("bob"));
        assert_eq!(routes.subscribe(7, Some("bob"), "a"), Ok(true));
        assert_eq!(routes.subscribe(7, Some("bob"), "b"), Ok(true));
        assert!(routes.unsubscribe(7, Some("bob"), "a"), "its first");
        assert_eq!(
            routes.subscribe(7, Some("bob"), "b"),
            Ok(false),
            "b is still there"
        );
        assert_eq!(routes.subscribers("b"), [7]);
        assert_eq!(routes.subscription_count(), 1);
        // Without an id, a connection with no channel left has no record.
        assert_eq!(routes.subscribe(8, None, "b"), Ok(true));
        assert!(routes.unsubscribe(8, None, "b"));
        assert_eq!(routes.members.len(), 1, "only bob's");
        routes.leave(7, Some("bob"));
        assert_eq!(
            (routes.members.len(), routes.more.len(), routes.id_count()),
            (0, 0, 0)
        );
        assert_eq!(routes.channel_count(), 0);
    }

    #[test]
    fn many_connections_and_channels_stay_consistent() {
        let mut routes = Routes::new(1000);
        for slot in 0..500u32 {
            for c in 0..(slot % 7) {
                let id = (slot % 2 == 0).then(|| format!("u{slot}"));
                routes
                    .subscribe(slot, id.as_deref(), &format!("c{c}"))
                    .unwrap();
            }
        }
        for slot in (0..500u32).step_by(3) {
            let id = (slot % 2 == 0).then(|| format!("u{slot}"));
            routes.leave(slot, id.as_deref());
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
