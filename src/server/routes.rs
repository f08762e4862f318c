//! Who a targeted message reaches: the connections of each client id and
//! the subscribers of each channel, indexed so that a message costs
//! O(its recipients), never a scan of the connections, and a connection
//! with no id and no channel costs nothing here.
//!
//! The indexes are `hashbrown` tables of small fixed-size entries whose
//! keys live elsewhere. A connection with an id is 4 bytes in the table
//! of holders: its slot, filed by its id's hash (the id stays in its
//! request target; the caller gives it to confirm a match, and to file
//! the holders again when the table grows). Each subscription is an
//! 8-byte membership, filed by slot, and 4 bytes in its channel's list.
//!
//! The holders' table grows only in [`Routes::make_room`], which the loop
//! calls once per pass with every connection's id at hand; a connection
//! that joins while it is full waits in a short list until then, and is
//! found there meanwhile.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use slab::Slab;

use crate::protocol::names::{ChannelNameRef, ClientIdRef};

/// A connection's slot in the loop's slab.
pub type Slot = u32;

/// How many joins the waiting list keeps room for between passes; a
/// burst's longer list is given back.
const JOINING_KEPT: usize = 256;

/// A subscription: connection `slot` is in `channel`.
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
    /// Connections with an id, filed by the id's hash.
    holders: HashTable<Slot>,
    /// Connections that joined with an id while `holders` was full, with
    /// the id's hash, until the next [`Routes::make_room`].
    joining: Vec<(Slot, u32)>,
    /// Channel indexes, by the channel name's hash.
    names: HashTable<u32>,
    channels: Slab<Channel>,
    /// Every subscription, filed by its connection's slot.
    memberships: HashTable<Membership>,
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

/// The 32 bits of `id`'s hash its holders are filed under.
fn id_hash(hasher: &RandomState, id: &str) -> u32 {
    hasher.hash_one(id) as u32
}

impl Routes {
    /// Empty indexes allowing at most `max_channels` channels at once.
    pub fn new(max_channels: usize) -> Routes {
        Routes {
            hasher: RandomState::new(),
            holders: HashTable::new(),
            joining: Vec::new(),
            names: HashTable::new(),
            channels: Slab::new(),
            memberships: HashTable::new(),
            subscriptions: 0,
            grown: false,
            max_channels,
        }
    }

    /// The connections holding `id`; `id_of` gives a connection's id, to
    /// tell apart ids whose hashes collide.
    pub fn holders<'a, 'f>(
        &'a self,
        id: ClientIdRef<'a>,
        id_of: impl Fn(Slot) -> Option<ClientIdRef<'f>> + 'a,
    ) -> impl Iterator<Item = Slot> + 'a {
        let hash = id_hash(&self.hasher, id.as_str());
        let filed = self.holders.iter_hash(spread(hash)).copied();
        let waiting = self
            .joining
            .iter()
            .filter(move |&&(_, h)| h == hash)
            .map(|&(slot, _)| slot);
        filed
            .chain(waiting)
            .filter(move |&slot| id_of(slot).map(ClientIdRef::as_str) == Some(id.as_str()))
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
        self.holders.len() + self.joining.len()
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
    pub fn subscribers(&self, name: ChannelNameRef<'_>) -> &[Slot] {
        self.channel(name.as_str())
            .map_or(&[], |i| &self.channels[i as usize].subscribers)
    }

    /// Every channel with its subscribers.
    pub fn channels(&self) -> impl Iterator<Item = (&str, &[Slot])> {
        self.channels
            .iter()
            .map(|(_, c)| (&*c.name, c.subscribers.as_slice()))
    }

    /// Enters a connection that just upgraded with client id `id` (if
    /// any) among the id's holders; it has no channel yet. Filed at once
    /// while the table has room, else when the loop next makes room.
    pub fn join(&mut self, slot: Slot, id: Option<ClientIdRef<'_>>) {
        let Some(id) = id else {
            return;
        };
        let hash = id_hash(&self.hasher, id.as_str());
        if self.holders.len() < self.holders.capacity() {
            // Room without growing, so the table never files the others
            // again here (it could not: their ids are not at hand).
            self.holders.insert_unique(spread(hash), slot, |_| {
                unreachable!("bug: a table with room grew")
            });
        } else {
            self.joining.push((slot, hash));
        }
    }

    /// Files the connections waiting to join, growing the holders' table
    /// as they need; `id_of` gives each holder's id, to file it again.
    pub fn make_room<'f>(&mut self, id_of: impl Fn(Slot) -> Option<ClientIdRef<'f>>) {
        if self.joining.is_empty() {
            return;
        }
        let hasher = &self.hasher;
        let hash_of =
            |&slot: &Slot| spread(id_of(slot).map_or(0, |id| id_hash(hasher, id.as_str())));
        let before = self.holders.capacity();
        self.holders.reserve(self.joining.len(), hash_of);
        for (slot, hash) in self.joining.drain(..) {
            self.holders.insert_unique(spread(hash), slot, hash_of);
        }
        self.joining.shrink_to(JOINING_KEPT);
        let after = self.holders.capacity();
        self.note(before, after);
    }

    /// Subscribes `slot` to `name`; `Ok(false)` if it already was.
    pub fn subscribe(
        &mut self,
        slot: Slot,
        name: ChannelNameRef<'_>,
    ) -> Result<bool, ChannelLimit> {
        let channel = self.channel_or_new(name.as_str())?;
        let membership = Membership { slot, channel };
        let hash = spread(slot);
        if self.memberships.find(hash, |m| *m == membership).is_some() {
            return Ok(false);
        }
        let before = self.memberships.capacity();
        self.memberships
            .insert_unique(hash, membership, |m| spread(m.slot));
        self.note(before, self.memberships.capacity());
        let subscribers = &mut self.channels[channel as usize].subscribers;
        let before = subscribers.capacity();
        subscribers.push(slot);
        let after = subscribers.capacity();
        self.note(before, after);
        self.subscriptions += 1;
        Ok(true)
    }

    /// Unsubscribes `slot` from `name`; `false` if it was not subscribed.
    pub fn unsubscribe(&mut self, slot: Slot, name: ChannelNameRef<'_>) -> bool {
        let Some(channel) = self.channel(name.as_str()) else {
            return false;
        };
        let membership = Membership { slot, channel };
        match self
            .memberships
            .find_entry(spread(slot), |m| *m == membership)
        {
            Ok(entry) => drop(entry.remove()),
            Err(_) => return false,
        }
        self.drop_subscriber(channel, slot);
        true
    }

    /// The names of the channels `slot` is subscribed to.
    pub fn channels_of(&self, slot: Slot) -> impl Iterator<Item = &str> {
        self.memberships
            .iter_hash(spread(slot))
            .filter(move |m| m.slot == slot)
            .map(|m| &*self.channels[m.channel as usize].name)
    }

    /// Takes `slot` (with client id `id`) out of every channel and out of
    /// the id's holders: its connection closed.
    pub fn leave(&mut self, slot: Slot, id: Option<ClientIdRef<'_>>) {
        if let Some(id) = id {
            let hash = id_hash(&self.hasher, id.as_str());
            match self.holders.find_entry(spread(hash), |&s| s == slot) {
                Ok(entry) => drop(entry.remove()),
                Err(_) => self.joining.retain(|&(s, _)| s != slot),
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

    fn id(name: &str) -> ClientIdRef<'_> {
        ClientIdRef::new(name).unwrap()
    }

    fn ch(name: &str) -> ChannelNameRef<'_> {
        ChannelNameRef::new(name).unwrap()
    }

    fn sorted(slots: impl IntoIterator<Item = Slot>) -> Vec<Slot> {
        let mut v: Vec<Slot> = slots.into_iter().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn ids_find_every_holder_and_only_theirs() {
        let mut routes = Routes::new(10);
        let ids = ["alice", "bob", "alice", "carol", "alice"];
        let id_of = |slot: Slot| ids.get(slot as usize).map(|name| id(name));
        for (slot, name) in ids.iter().enumerate() {
            routes.join(slot as Slot, Some(id(name)));
        }
        for made_room in [false, true] {
            assert_eq!(sorted(routes.holders(id("alice"), id_of)), [0, 2, 4]);
            assert_eq!(sorted(routes.holders(id("bob"), id_of)), [1]);
            assert_eq!(
                sorted(routes.holders(id("dave"), id_of)),
                Vec::<Slot>::new()
            );
            assert_eq!(routes.id_count(), 5);
            assert_eq!(routes.joining.is_empty(), made_room);
            routes.make_room(id_of);
        }
        routes.leave(2, Some(id("alice")));
        assert_eq!(sorted(routes.holders(id("alice"), id_of)), [0, 4]);
        assert_eq!(routes.id_count(), 4);
    }

    #[test]
    fn an_id_whose_hash_collides_is_told_apart() {
        let mut routes = Routes::new(10);
        // Two holders entered under the same hash, as a collision would.
        let hash = id_hash(&routes.hasher, "alice");
        routes.joining.extend([(1, hash), (2, hash)]);
        let id_of = |slot: Slot| match slot {
            1 => Some(id("alice")),
            2 => Some(id("mallory")),
            _ => None,
        };
        assert_eq!(sorted(routes.holders(id("alice"), id_of)), [1], "waiting");
        let mut filed = Routes::new(10);
        filed.hasher = routes.hasher.clone();
        for slot in [1, 2] {
            filed.holders.insert_unique(spread(hash), slot, |_| 0);
        }
        assert_eq!(sorted(filed.holders(id("alice"), id_of)), [1], "filed");
    }

    /// Holders that joined while the table was full are found, can leave
    /// before they are filed, and are filed under their own ids when the
    /// table grows, the earlier holders again under theirs.
    #[test]
    fn joins_wait_for_room_and_are_filed_when_it_grows() {
        let mut routes = Routes::new(10);
        let ids: Vec<String> = (0..1000).map(|i| format!("u{}", i % 300)).collect();
        let id_of = |slot: Slot| ids.get(slot as usize).map(|name| id(name));
        let mut waited = 0;
        for slot in 0..1000u32 {
            routes.join(slot, id_of(slot));
            waited = waited.max(routes.joining.len());
            if slot == 500 {
                routes.leave(slot, id_of(slot));
            }
            if slot % 7 == 0 {
                routes.make_room(id_of);
                assert!(routes.joining.is_empty());
            }
        }
        assert!(waited > 1, "joins waited for room");
        assert!(routes.take_grown(), "the holders' table grew");
        let holders_of =
            |routes: &Routes, i: u32| sorted(routes.holders(id(&ids[i as usize]), id_of));
        for made_room in [false, true] {
            for i in [0u32, 200, 299] {
                let want: Vec<Slot> = (0..1000).filter(|s| s % 300 == i && *s != 500).collect();
                assert_eq!(holders_of(&routes, i), want, "u{i} {made_room}");
            }
            assert_eq!(routes.id_count(), 999);
            routes.make_room(id_of);
        }
        for slot in 0..1000u32 {
            routes.leave(slot, id_of(slot));
        }
        assert_eq!(routes.id_count(), 0);
    }

    #[test]
    fn subscriptions_come_and_go_with_their_channels() {
        let mut routes = Routes::new(2);
        assert_eq!(routes.subscribe(1, ch("news")), Ok(true));
        assert_eq!(routes.subscribe(1, ch("news")), Ok(false), "once");
        assert_eq!(routes.subscribe(2, ch("news")), Ok(true));
        assert_eq!(routes.subscribe(2, ch("chat")), Ok(true));
        assert_eq!(
            routes.subscribe(3, ch("sport")),
            Err(ChannelLimit),
            "two at most"
        );
        assert_eq!(
            sorted(routes.subscribers(ch("news")).iter().copied()),
            [1, 2]
        );
        assert!(routes.unsubscribe(1, ch("news")));
        assert!(!routes.unsubscribe(1, ch("news")));
        assert!(!routes.unsubscribe(1, ch("nothing")));
        assert_eq!(routes.subscribers(ch("news")), [2]);
        routes.leave(2, None);
        assert_eq!(routes.channel_count(), 0, "empty channels are dropped");
        assert_eq!(routes.subscription_count(), 0);
        assert_eq!(routes.subscribers(ch("news")), [] as [Slot; 0]);
        assert_eq!(routes.subscribe(3, ch("sport")), Ok(true), "room again");
    }

    #[test]
    fn a_connection_is_in_a_channel_once_and_leaves_nothing_behind() {
        let mut routes = Routes::new(10);
        routes.join(7, Some(id("bob")));
        assert_eq!(routes.subscribe(7, ch("a")), Ok(true));
        assert_eq!(routes.subscribe(7, ch("b")), Ok(true));
        assert!(routes.unsubscribe(7, ch("a")));
        assert_eq!(routes.subscribe(7, ch("b")), Ok(false), "b is still there");
        assert_eq!(routes.subscribers(ch("b")), [7]);
        assert_eq!(routes.subscription_count(), 1);
        assert_eq!(routes.subscribe(8, ch("b")), Ok(true));
        assert!(routes.unsubscribe(8, ch("b")));
        assert_eq!(routes.memberships.len(), 1, "only bob's");
        routes.leave(7, Some(id("bob")));
        assert_eq!(
            (
                routes.holders.len() + routes.joining.len(),
                routes.memberships.len(),
                routes.id_count()
            ),
            (0, 0, 0)
        );
        assert_eq!(routes.channel_count(), 0);
    }

    #[test]
    fn many_connections_and_channels_stay_consistent() {
        let mut routes = Routes::new(1000);
        let name = |slot: u32| slot.is_multiple_of(2).then(|| format!("u{slot}"));
        for slot in 0..500u32 {
            routes.join(slot, name(slot).as_deref().map(id));
            for c in 0..(slot % 7) {
                routes.subscribe(slot, ch(&format!("c{c}"))).unwrap();
            }
        }
        for slot in (0..500u32).step_by(3) {
            routes.leave(slot, name(slot).as_deref().map(id));
        }
        for c in 0..7u32 {
            let want: Vec<Slot> = (0..500).filter(|s| s % 3 != 0 && s % 7 > c).collect();
            assert_eq!(
                sorted(routes.subscribers(ch(&format!("c{c}"))).iter().copied()),
                want,
                "c{c}"
            );
        }
        let held = (0..500u32).filter(|s| s % 2 == 0 && s % 3 != 0).count();
        assert_eq!(routes.id_count(), held);
    }
}
