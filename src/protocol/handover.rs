//! The handover's state format, versioned: what a successor asks
//! ([`Ask`]), what the process it replaces answers ([`Answer`]), then one
//! record per connection ([`Moved`]) and an end ([`Record::End`]). Pure:
//! bytes in, values out, and a record cut anywhere is only "not yet".
//!
//! Every number is little-endian. A record is a tag byte, its body's
//! length (4 bytes) and its body, so a reader can tell a record it does
//! not know from a broken stream. The version is asked for and answered:
//! a process that cannot write what its successor reads refuses, and the
//! successor falls back to a drain.

/// What every ask and answer begins with.
pub(crate) const MAGIC: [u8; 8] = *b"wspushHO";

/// The version of the format this build writes and reads.
pub const VERSION: u16 = 1;

/// The bytes of an [`Ask`] and of an [`Answer`].
pub(crate) const HEAD_BYTES: usize = MAGIC.len() + 2 + 8;

/// The bytes of a decoder's state in a record.
pub(crate) const DECODER_BYTES: usize = crate::protocol::ws::decoder::DECODER_BYTES;

/// The largest record body read: a connection's queued output is bounded
/// by `--max-queued-bytes`, its held input by the request and frame
/// limits; this bounds a broken stream's claim.
pub(crate) const MAX_BODY: usize = 1 << 30;

/// Why bytes are not a record (or an ask, or an answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FormatError {
    /// It does not begin with [`MAGIC`].
    NotHandover,
    /// A version this build does not read.
    Version(u16),
    /// A body longer than [`MAX_BODY`], or shorter than its fields.
    Malformed,
    /// A tag this version does not know.
    UnknownRecord(u8),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::NotHandover => write!(f, "not a handover"),
            FormatError::Version(v) => {
                write!(f, "state format version {v} (this build reads {VERSION})")
            }
            FormatError::Malformed => write!(f, "a malformed record"),
            FormatError::UnknownRecord(tag) => write!(f, "an unknown record (tag {tag})"),
        }
    }
}

/// A successor's ask: the version it reads, and the first input line it
/// reads itself (the process it replaces delivers every line before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    /// The state format's version it reads.
    pub(crate) version: u16,
    /// The first position it frames from its own input.
    pub(crate) first: u64,
}

/// The answer to an [`Ask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The connections follow, in this version, each given every message
    /// up to `through` (a position) but where its record says otherwise.
    Give {
        /// The format's version.
        version: u16,
        /// The last position the giving process delivered.
        through: u64,
    },
    /// It keeps its connections (a drain follows).
    Refuse,
}

/// Writes a head: the magic, a version and a number.
fn head(version: u16, number: u64) -> [u8; HEAD_BYTES] {
    let mut out = [0u8; HEAD_BYTES];
    out[..8].copy_from_slice(&MAGIC);
    out[8..10].copy_from_slice(&version.to_le_bytes());
    out[10..].copy_from_slice(&number.to_le_bytes());
    out
}

/// Reads a head: its version and number.
fn read_head(bytes: &[u8; HEAD_BYTES]) -> Result<(u16, u64), FormatError> {
    if bytes[..8] != MAGIC {
        return Err(FormatError::NotHandover);
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    Ok((version, u64::from_le_bytes(bytes[10..].try_into().unwrap())))
}

impl Ask {
    /// Its bytes.
    pub(crate) fn encode(&self) -> [u8; HEAD_BYTES] {
        head(self.version, self.first)
    }

    /// The ask in `bytes` (any version: the answer says what is written).
    pub(crate) fn decode(bytes: &[u8; HEAD_BYTES]) -> Result<Ask, FormatError> {
        let (version, first) = read_head(bytes)?;
        Ok(Ask { version, first })
    }
}

impl Answer {
    /// Its bytes (a refusal is version 0).
    pub(crate) fn encode(&self) -> [u8; HEAD_BYTES] {
        match *self {
            Answer::Give { version, through } => head(version, through),
            Answer::Refuse => head(0, 0),
        }
    }

    /// The answer in `bytes`; a version other than ours is an error.
    pub(crate) fn decode(bytes: &[u8; HEAD_BYTES]) -> Result<Answer, FormatError> {
        match read_head(bytes)? {
            (0, _) => Ok(Answer::Refuse),
            (VERSION, through) => Ok(Answer::Give {
                version: VERSION,
                through,
            }),
            (version, _) => Err(FormatError::Version(version)),
        }
    }
}

/// One connection's state, as it moves: everything its successor needs
/// to go on serving it where it stands. Its socket moves beside it, one
/// descriptor per record, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Moved {
    /// Its slot, kept: its key (`INSTANCE.SLOT.SERIAL`) stays valid.
    pub(crate) slot: u32,
    /// Its serial.
    pub(crate) serial: u32,
    /// Its wire: 0 WebSocket, 1 WebSocket inflating only, 2 WebSocket
    /// with permessage-deflate both ways, 3 an event stream.
    pub(crate) wire: u8,
    /// Whether it asked for positions.
    pub(crate) positions: bool,
    /// Its heartbeat state.
    pub(crate) liveness: u16,
    /// When its token's close is due, in milliseconds since the Unix
    /// epoch (0: none).
    pub(crate) closes_at_ms: u64,
    /// Given every message up to this position; owed those after it.
    pub(crate) given: u64,
    /// Its frame decoder.
    pub(crate) decoder: [u8; DECODER_BYTES],
    /// Its request target as kept (path and query, without the token).
    pub(crate) target: String,
    /// Its channels.
    pub(crate) channels: Vec<String>,
    /// Received bytes not consumed yet (a partial frame).
    pub(crate) held: Vec<u8>,
    /// A message being assembled from several pieces.
    pub(crate) assembling: Vec<u8>,
    /// Bytes queued for its socket and not taken yet.
    pub(crate) queued: Vec<u8>,
}

/// A record of the stream after the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// A connection (its descriptor is the next one).
    Conn(Box<Moved>),
    /// The end: this many connections were given.
    End {
        /// Connection records sent.
        count: u32,
    },
}

const TAG_CONN: u8 = b'C';
const TAG_END: u8 = b'E';

/// Appends `bytes` with their length.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads the fields of a body in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.0.len() < n {
            return Err(FormatError::Malformed);
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }

    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn bytes(&mut self) -> Result<&'a [u8], FormatError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn string(&mut self) -> Result<String, FormatError> {
        let bytes = self.bytes()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| FormatError::Malformed)
    }
}

impl Record {
    /// Appends its bytes to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        match self {
            Record::Conn(m) => {
                out.push(TAG_CONN);
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&m.slot.to_le_bytes());
                out.extend_from_slice(&m.serial.to_le_bytes());
                out.push(m.wire);
                out.push(u8::from(m.positions));
                out.extend_from_slice(&m.liveness.to_le_bytes());
                out.extend_from_slice(&m.closes_at_ms.to_le_bytes());
                out.extend_from_slice(&m.given.to_le_bytes());
                out.extend_from_slice(&m.decoder);
                put_bytes(out, m.target.as_bytes());
                out.extend_from_slice(&(m.channels.len() as u32).to_le_bytes());
                for channel in &m.channels {
                    put_bytes(out, channel.as_bytes());
                }
                put_bytes(out, &m.held);
                put_bytes(out, &m.assembling);
                put_bytes(out, &m.queued);
            }
            Record::End { count } => {
                out.push(TAG_END);
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&count.to_le_bytes());
            }
        }
        let body = (out.len() - start - 5) as u32;
        out[start + 1..start + 5].copy_from_slice(&body.to_le_bytes());
    }

    /// The record at the start of `bytes` and the bytes it takes, or
    /// `None` while it is not all there.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Option<(Record, usize)>, FormatError> {
        let Some(&[tag, a, b, c, d]) = bytes.get(..5) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([a, b, c, d]) as usize;
        if len > MAX_BODY {
            return Err(FormatError::Malformed);
        }
        let Some(body) = bytes.get(5..5 + len) else {
            return Ok(None);
        };
        let mut f = Fields(body);
        let record = match tag {
            TAG_CONN => Record::Conn(Box::new(Moved {
                slot: f.u32()?,
                serial: f.u32()?,
                wire: f.u8()?,
                positions: f.u8()? != 0,
                liveness: f.u16()?,
                closes_at_ms: f.u64()?,
                given: f.u64()?,
                decoder: f.take(DECODER_BYTES)?.try_into().unwrap(),
                target: f.string()?,
                channels: (0..f.u32()?)
                    .map(|_| f.string())
                    .collect::<Result<_, _>>()?,
                held: f.bytes()?.to_vec(),
                assembling: f.bytes()?.to_vec(),
                queued: f.bytes()?.to_vec(),
            })),
            TAG_END => Record::End { count: f.u32()? },
            other => return Err(FormatError::UnknownRecord(other)),
        };
        Ok(Some((record, 5 + len)))
    }
}

/// What an [`Image`] begins with.
pub(crate) const IMAGE_MAGIC: [u8; 8] = *b"wspushRX";

/// A process's state as it re-executes itself: what its next image
/// needs to go on serving where it stands (see `server::reexec`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Image {
    /// The last position delivered.
    pub(crate) through: u64,
    /// When the loop stopped (the host's monotonic clock, ns): the next
    /// image tells the whole pause.
    pub(crate) stopped_ns: u64,
    /// The descriptors it names, kept open across the exec: the
    /// listener, the history's memory, then one per connection record,
    /// in order.
    pub(crate) fds: Vec<i32>,
    /// The ages (ms) of the history's records, oldest first, if this
    /// process writes the history.
    pub(crate) ages_ms: Option<Vec<u64>>,
    /// What the embedding program keeps beside (the binary: its input's
    /// unfinished line).
    pub(crate) extra: Vec<u8>,
    /// The connection records, then [`Record::End`].
    pub(crate) records: Vec<u8>,
}

impl Image {
    /// Its bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.records.len() + 4 * self.fds.len());
        out.extend_from_slice(&IMAGE_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.through.to_le_bytes());
        out.extend_from_slice(&self.stopped_ns.to_le_bytes());
        out.extend_from_slice(&(self.fds.len() as u32).to_le_bytes());
        for fd in &self.fds {
            out.extend_from_slice(&fd.to_le_bytes());
        }
        match &self.ages_ms {
            None => out.push(0),
            Some(ages) => {
                out.push(1);
                out.extend_from_slice(&(ages.len() as u32).to_le_bytes());
                for age in ages {
                    out.extend_from_slice(&age.to_le_bytes());
                }
            }
        }
        put_bytes(&mut out, &self.extra);
        put_bytes(&mut out, &self.records);
        out
    }

    /// The image in `bytes`, whole; another version is an error.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Image, FormatError> {
        let mut f = Fields(bytes);
        if f.take(IMAGE_MAGIC.len())? != IMAGE_MAGIC {
            return Err(FormatError::NotHandover);
        }
        match f.u16()? {
            VERSION => {}
            other => return Err(FormatError::Version(other)),
        }
        let through = f.u64()?;
        let stopped_ns = f.u64()?;
        let fds = (0..f.u32()?)
            .map(|_| f.u32().map(|fd| fd as i32))
            .collect::<Result<_, _>>()?;
        let ages_ms = match f.u8()? {
            0 => None,
            _ => Some((0..f.u32()?).map(|_| f.u64()).collect::<Result<_, _>>()?),
        };
        let image = Image {
            through,
            stopped_ns,
            fds,
            ages_ms,
            extra: f.bytes()?.to_vec(),
            records: f.bytes()?.to_vec(),
        };
        match f.0.is_empty() {
            true => Ok(image),
            false => Err(FormatError::Malformed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved() -> Moved {
        Moved {
            slot: 17,
            serial: 0xDEAD_BEEF,
            wire: 2,
            positions: true,
            liveness: 0x8001,
            closes_at_ms: 1_800_000_000_123,
            given: 41,
            decoder: [7; DECODER_BYTES],
            target: "/ws?id=alice".into(),
            channels: vec!["news".into(), "chat".into()],
            held: vec![0x81, 0x85],
            assembling: b"hel".to_vec(),
            queued: vec![0x81, 2, b'h', b'i'],
        }
    }

    #[test]
    fn a_record_read_back_is_the_same_at_every_cut() {
        let records = [
            Record::Conn(Box::new(moved())),
            Record::Conn(Box::default()),
            Record::End { count: 2 },
        ];
        let mut bytes = Vec::new();
        records.iter().for_each(|r| r.encode(&mut bytes));
        // Whole, one after the other.
        let mut at = 0;
        for record in &records {
            let (read, used) = Record::decode(&bytes[at..]).unwrap().unwrap();
            assert_eq!(&read, record);
            at += used;
        }
        assert_eq!(at, bytes.len());
        // Cut anywhere inside the first: not yet, never an error.
        let (_, first) = Record::decode(&bytes).unwrap().unwrap();
        for cut in 0..first {
            assert_eq!(Record::decode(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn broken_records_are_errors_not_panics() {
        let mut bytes = Vec::new();
        Record::Conn(Box::new(moved())).encode(&mut bytes);
        // A body shorter than its fields.
        let mut short = bytes.clone();
        let body = u32::from_le_bytes(short[1..5].try_into().unwrap()) - 3;
        short[1..5].copy_from_slice(&body.to_le_bytes());
        short.truncate(5 + body as usize);
        assert_eq!(Record::decode(&short), Err(FormatError::Malformed));
        // An unknown tag; a length past the bound.
        assert_eq!(
            Record::decode(&[b'Z', 0, 0, 0, 0]),
            Err(FormatError::UnknownRecord(b'Z'))
        );
        assert_eq!(
            Record::decode(&[b'C', 0xFF, 0xFF, 0xFF, 0xFF]),
            Err(FormatError::Malformed)
        );
        // A target that is not UTF-8.
        let mut m = moved();
        m.target = String::new();
        let mut bad = Vec::new();
        Record::Conn(Box::new(m)).encode(&mut bad);
        let at = 5 + 4 + 4 + 1 + 1 + 2 + 8 + 8 + DECODER_BYTES;
        bad.splice(at..at + 4, [1, 0, 0, 0, 0xFF]);
        let body = (bad.len() - 5) as u32;
        bad[1..5].copy_from_slice(&body.to_le_bytes());
        assert_eq!(Record::decode(&bad), Err(FormatError::Malformed));
    }

    #[test]
    fn asks_and_answers_say_their_version() {
        let ask = Ask {
            version: VERSION,
            first: 1234,
        };
        assert_eq!(Ask::decode(&ask.encode()), Ok(ask));
        let give = Answer::Give {
            version: VERSION,
            through: 1233,
        };
        assert_eq!(Answer::decode(&give.encode()), Ok(give));
        assert_eq!(Answer::decode(&Answer::Refuse.encode()), Ok(Answer::Refuse));
        let newer = Answer::Give {
            version: VERSION + 1,
            through: 1,
        };
        assert_eq!(
            Answer::decode(&newer.encode()),
            Err(FormatError::Version(VERSION + 1))
        );
        let mut junk = ask.encode();
        junk[0] = b'X';
        assert_eq!(Ask::decode(&junk), Err(FormatError::NotHandover));
    }

    #[test]
    fn an_image_read_back_is_the_same_and_a_cut_one_is_an_error() {
        let mut records = Vec::new();
        Record::Conn(Box::new(moved())).encode(&mut records);
        Record::End { count: 1 }.encode(&mut records);
        for ages_ms in [None, Some(vec![5, 0, 70_000])] {
            let image = Image {
                through: 41,
                stopped_ns: 123_456_789,
                fds: vec![3, 4, 1000],
                ages_ms,
                extra: b"half a li".to_vec(),
                records: records.clone(),
            };
            let bytes = image.encode();
            assert_eq!(Image::decode(&bytes), Ok(image));
            for cut in 0..bytes.len() {
                assert!(Image::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(Image::decode(&longer), Err(FormatError::Malformed));
        }
        let mut other = Image::default().encode();
        other[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
        assert_eq!(
            Image::decode(&other),
            Err(FormatError::Version(VERSION + 1))
        );
    }
}
