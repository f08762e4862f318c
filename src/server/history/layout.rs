//! How the history's ring lies in its memory: the header's words, the
//! lengths of its parts ([`Layout`], which a header may say), and a
//! record's head.

/// The magic of a ring laid out as [`Layout::FIRST`] (which every build
/// of the program reads).
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"wspushH3");
/// The magic of a ring whose header says its layout (see [`Layout`]).
pub(super) const MAGIC_DESCRIBED: u64 = u64::from_le_bytes(*b"wspushH4");
/// The header's words, by index.
pub(super) const MAGIC_AT: usize = 0;
pub(super) const EPOCH: usize = 1;
pub(super) const DATA: usize = 2;
pub(super) const SLOTS: usize = 3;
/// The data the writer may be writing, up to (absolute bytes).
pub(super) const RESERVE: usize = 4;
/// The records written so far.
pub(super) const RECORDS: usize = 5;
/// The oldest record in the history.
pub(super) const OLDEST: usize = 6;
/// Every message up to this position has left the history.
pub(super) const FORGOTTEN: usize = 7;
/// The last position written.
pub(super) const LAST: usize = 8;
/// Messages and bytes in the history.
pub(super) const MESSAGES: usize = 9;
pub(super) const BYTES: usize = 10;
/// Messages refused so far (each larger than the byte bound alone).
pub(super) const REFUSED: usize = 11;
/// The layout's lengths, in a ring of [`MAGIC_DESCRIBED`]: header,
/// slot, record head.
pub(super) const HEADER_LEN_AT: usize = 12;
pub(super) const SLOT_LEN_AT: usize = 13;
pub(super) const RECORD_HEAD_AT: usize = 14;
/// The words a header holds at least.
pub(super) const HEADER_WORDS: usize = 15;
/// A record head's fields end here; a layout's heads may be longer.
pub(super) const RECORD_FIELDS: usize = 16;
/// A slot's fields (three words) end here; a layout's slots may be longer.
pub(super) const SLOT_FIELDS: usize = 24;
/// The longest record head a ring may have.
pub(super) const MAX_RECORD_HEAD: usize = 64;
/// In a record head's flags: the message was refused (no frames).
pub(super) const REFUSED_FLAG: u8 = 1;
/// In a record head's flags: the message is a status about the stream
/// (a gap), not one of its messages. A bit a writer of the layout before
/// it left clear, so the layout (and its magic) stays.
pub(super) const STATUS_FLAG: u8 = 2;

/// The lengths a ring is laid out by. Its parts only ever grow at their
/// ends: a header's words, a slot's (first, last, where) and a record
/// head's fields stay where they are, so a build reads and writes a ring
/// of any layout whose parts hold the fields it knows, ignoring (and
/// leaving zero) what comes after. A build creates its rings in its own
/// layout ([`Layout::OWN`]); a ring of another one it goes on writing is
/// carried into its own (see `Ring::resume`), so a new layout is
/// deployed by a re-exec, with the same epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The header's bytes (a multiple of the page).
    pub header: usize,
    /// A slot's bytes.
    pub slot: usize,
    /// A record head's bytes.
    pub head: usize,
}

impl Layout {
    /// The first layout, which [`MAGIC`] names and every build reads: the
    /// writer's words in the first page, and the second kept free (the
    /// host's words once were there; they have a memory of their own now,
    /// see `time::host`).
    pub const FIRST: Layout = Layout {
        header: 2 * 4096,
        slot: SLOT_FIELDS,
        head: RECORD_FIELDS,
    };

    /// The layout this build creates its rings in.
    #[cfg(not(feature = "next-ring-layout"))]
    pub const OWN: Layout = Layout::FIRST;

    /// The layout this build creates its rings in: a larger header, slot
    /// and record head than [`Layout::FIRST`], for the tests of a layout
    /// deployed by a re-exec.
    #[cfg(feature = "next-ring-layout")]
    pub const OWN: Layout = Layout {
        header: 3 * 4096,
        slot: SLOT_FIELDS + 8,
        head: RECORD_FIELDS + 8,
    };

    /// The layout a header of `magic` says (its words read by `word`), if
    /// one this build reads.
    pub(super) fn read(magic: u64, word: impl Fn(usize) -> u64) -> Option<Layout> {
        let layout = match magic {
            MAGIC => Layout::FIRST,
            MAGIC_DESCRIBED => Layout {
                header: usize::try_from(word(HEADER_LEN_AT)).ok()?,
                slot: usize::try_from(word(SLOT_LEN_AT)).ok()?,
                head: usize::try_from(word(RECORD_HEAD_AT)).ok()?,
            },
            _ => return None,
        };
        let holds = layout.header >= HEADER_WORDS * 8
            && layout.header % 4096 == 0
            && layout.slot >= SLOT_FIELDS
            && layout.slot % 8 == 0
            && layout.head >= RECORD_FIELDS
            && layout.head <= MAX_RECORD_HEAD
            && layout.head % 8 == 0;
        holds.then_some(layout)
    }

    /// The magic a ring of this layout is marked with.
    pub(super) fn magic(self) -> u64 {
        match self == Layout::FIRST {
            true => MAGIC,
            false => MAGIC_DESCRIBED,
        }
    }

    /// Where the data starts, after the header and `slots` slots.
    pub(super) fn data_at(self, slots: u64) -> usize {
        (self.header + slots as usize * self.slot).next_multiple_of(4096)
    }

    /// A record's length, with its parts' lengths, rounded to a word.
    pub(super) fn record_len(self, parts: usize) -> usize {
        (self.head + parts).next_multiple_of(8)
    }
}

/// Who a record's messages were for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudienceKind {
    /// Everyone.
    All = 0,
    /// The subscribers of the channels named (comma-separated).
    Channels = 1,
    /// The connections of the client id named.
    Id = 2,
    /// One connection (never replayed: a resume is another connection).
    Conn = 3,
}

impl AudienceKind {
    pub(super) fn of(byte: u8) -> AudienceKind {
        match byte {
            0 => AudienceKind::All,
            1 => AudienceKind::Channels,
            2 => AudienceKind::Id,
            _ => AudienceKind::Conn,
        }
    }
}

/// A record's head, as written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Head {
    /// The whole record's bytes.
    pub len: usize,
    /// Its frames' bytes, then its compressed frames'.
    pub plain: usize,
    pub compressed: usize,
    /// Its recipients' bytes.
    pub names: usize,
    pub kind: AudienceKind,
    pub flags: u8,
}

impl Head {
    pub(super) fn encode(self) -> [u8; RECORD_FIELDS] {
        let mut head = [0u8; RECORD_FIELDS];
        head[0..4].copy_from_slice(&(self.len as u32).to_le_bytes());
        head[4..8].copy_from_slice(&(self.plain as u32).to_le_bytes());
        head[8..12].copy_from_slice(&(self.compressed as u32).to_le_bytes());
        head[12..14].copy_from_slice(&(self.names as u16).to_le_bytes());
        head[14] = self.kind as u8;
        head[15] = self.flags;
        head
    }

    pub(super) fn decode(head: &[u8; RECORD_FIELDS]) -> Head {
        let word =
            |i: usize| u32::from_le_bytes(head[i * 4..i * 4 + 4].try_into().unwrap()) as usize;
        Head {
            len: word(0),
            plain: word(1),
            compressed: word(2),
            names: usize::from(head[12]) | usize::from(head[13]) << 8,
            kind: AudienceKind::of(head[14]),
            flags: head[15],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_of_an_unknown_magic_or_lengths_short_of_the_fields_is_refused() {
        let word = |lengths: [u64; 3]| {
            move |at: usize| match at {
                HEADER_LEN_AT => lengths[0],
                SLOT_LEN_AT => lengths[1],
                RECORD_HEAD_AT => lengths[2],
                _ => 0,
            }
        };
        let any = word([0, 0, 0]);
        assert_eq!(Layout::read(MAGIC, any), Some(Layout::FIRST));
        assert_eq!(Layout::read(u64::from_le_bytes(*b"wspushH2"), any), None);
        let layout = Layout::read(MAGIC_DESCRIBED, word([3 * 4096, 32, 24]));
        assert_eq!(
            layout,
            Some(Layout {
                header: 3 * 4096,
                slot: 32,
                head: 24
            })
        );
        for short in [
            [4096, 16, 16],
            [4096, 24, 8],
            [100, 24, 16],
            [4096, 28, 16],
            [4096, 24, 72],
        ] {
            assert_eq!(
                Layout::read(MAGIC_DESCRIBED, word(short)),
                None,
                "{short:?}"
            );
        }
    }
}
