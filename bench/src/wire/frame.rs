//! WebSocket frames (RFC 6455 §5.2) as the bench sees them: an
//! incremental reader for a server's unmasked frames, an encoder for both
//! directions, and the header parser and unmasking the floor needs to echo
//! a client's masked frames.
//!
//! The reader is built for tens of thousands of sockets read through one
//! shared scratch buffer: a frame that arrives whole in one read is handed
//! out as a slice of that buffer without copying, and only a frame split
//! across reads is collected in the reader's own (normally empty) buffer.

/// Frame opcodes (RFC 6455 §5.2).
pub mod opcode {
    /// Continuation of a fragmented message.
    pub const CONTINUATION: u8 = 0x0;
    /// Text data frame.
    pub const TEXT: u8 = 0x1;
    /// Binary data frame.
    pub const BINARY: u8 = 0x2;
    /// Connection close.
    pub const CLOSE: u8 = 0x8;
    /// Ping; the peer must answer with a pong carrying the same payload.
    pub const PING: u8 = 0x9;
    /// Pong.
    pub const PONG: u8 = 0xA;
}

/// Mask for the few frames a client sends (pongs): RFC 6455's example key.
/// Masking defends browsers against cache poisoning through proxies; there
/// is no proxy on loopback, so a fixed key is enough.
pub const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// Largest payload the reader accepts; the push messages are tens of bytes.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Longest header of an unmasked frame: 2 bytes plus an 8-byte length.
const MAX_HEADER: usize = 10;

/// One complete frame; the payload borrows from the input or the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Final fragment of a message.
    pub fin: bool,
    /// One of the [`opcode`] constants.
    pub opcode: u8,
    /// RSV1: the message is compressed (permessage-deflate, RFC 7692);
    /// whoever reads it refuses it if that was not negotiated.
    pub compressed: bool,
    /// Payload bytes (already unmasked: server frames carry no mask).
    pub payload: &'a [u8],
}

/// A frame the reader refuses: the connection cannot be read further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// A server frame had the mask bit set (forbidden by RFC 6455 §5.1).
    Masked,
    /// A reserved bit was set without a negotiated extension.
    ReservedBits,
    /// A control frame was fragmented or longer than 125 bytes.
    BadControl,
    /// The payload is larger than [`MAX_PAYLOAD`].
    TooLarge,
    /// A client frame had no mask (forbidden by RFC 6455 §5.1).
    Unmasked,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FrameError::Masked => "masked server frame",
            FrameError::ReservedBits => "reserved bits set",
            FrameError::BadControl => "malformed control frame",
            FrameError::TooLarge => "frame too large",
            FrameError::Unmasked => "unmasked client frame",
        })
    }
}

impl std::error::Error for FrameError {}

/// The parsed header of the frame whose payload is being read.
#[derive(Debug, Clone, Copy)]
struct Header {
    fin: bool,
    opcode: u8,
    compressed: bool,
    /// Payload length; at most [`MAX_PAYLOAD`], so it fits in 32 bits.
    len: u32,
}

/// Incremental frame reader: feed it whatever each `read()` returned.
#[derive(Debug, Default)]
pub struct FrameReader {
    /// Header bytes gathered so far when a header straddles two reads.
    head: [u8; MAX_HEADER],
    head_len: u8,
    /// The frame whose payload is being read, once its header is complete.
    current: Option<Header>,
    /// Payload bytes gathered so far when a payload straddles two reads.
    body: Vec<u8>,
}

impl FrameReader {
    /// Creates a reader positioned at the start of a frame.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes `input`, calling `on_frame` for every frame it completes.
    ///
    /// Stops at the first error, either the reader's own ([`FrameError`],
    /// converted into `E`) or one returned by `on_frame`; after an error the
    /// reader's state is unspecified and the connection should be dropped.
    pub fn feed<E: From<FrameError>>(
        &mut self,
        mut input: &[u8],
        mut on_frame: impl FnMut(Frame<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        loop {
            let Some(header) = self.current else {
                if input.is_empty() {
                    return Ok(());
                }
                input = self.read_header(input)?;
                continue;
            };
            let len = header.len as usize;
            if self.body.is_empty() && input.len() >= len {
                // Fast path: the whole payload is in this read.
                let (payload, rest) = input.split_at(len);
                self.current = None;
                on_frame(header.frame(payload))?;
                input = rest;
            } else {
                let take = (len - self.body.len()).min(input.len());
                self.body.extend_from_slice(&input[..take]);
                input = &input[take..];
                if self.body.len() < len {
                    return Ok(());
                }
                self.current = None;
                let result = on_frame(header.frame(&self.body));
                self.body.clear();
                result?;
            }
        }
    }

    /// Reads header bytes from `input` (non-empty); returns the rest of it.
    /// Sets `current` once the header is complete.
    fn read_header<'a>(&mut self, input: &'a [u8]) -> Result<&'a [u8], FrameError> {
        if self.head_len == 0 {
            // Fast path: parse straight from the input.
            if let Some((header, used)) = parse_header(input)? {
                self.current = Some(header);
                return Ok(&input[used..]);
            }
        }
        // Slow path: gather the header byte-range by byte-range.
        let have = self.head_len as usize;
        let want = if have < 2 {
            2
        } else {
            header_len(self.head[1])?
        };
        let take = (want - have).min(input.len());
        self.head[have..have + take].copy_from_slice(&input[..take]);
        self.head_len += take as u8;
        if let Some((header, _)) = parse_header(&self.head[..self.head_len as usize])? {
            self.current = Some(header);
            self.head_len = 0;
        }
        Ok(&input[take..])
    }
}

impl Header {
    fn frame(self, payload: &[u8]) -> Frame<'_> {
        Frame {
            fin: self.fin,
            opcode: self.opcode,
            compressed: self.compressed,
            payload,
        }
    }
}

/// Total header length announced by the second header byte.
fn header_len(second: u8) -> Result<usize, FrameError> {
    if second & 0x80 != 0 {
        return Err(FrameError::Masked);
    }
    Ok(match second & 0x7F {
        126 => 4,
        127 => 10,
        _ => 2,
    })
}

/// Parses a complete header at the start of `buf`; `None` if more bytes are needed.
fn parse_header(buf: &[u8]) -> Result<Option<(Header, usize)>, FrameError> {
    let [first, second, ..] = *buf else {
        return Ok(None);
    };
    let used = header_len(second)?;
    if buf.len() < used {
        return Ok(None);
    }
    // RSV2 and RSV3 belong to no extension here; RSV1 to permessage-deflate
    // on a data frame.
    if first & 0x30 != 0 || (first & 0x40 != 0 && first & 0x08 != 0) {
        return Err(FrameError::ReservedBits);
    }
    let len = match used {
        2 => u64::from(second & 0x7F),
        4 => u64::from(u16::from_be_bytes([buf[2], buf[3]])),
        _ => u64::from_be_bytes(buf[2..10].try_into().expect("8 length bytes")),
    };
    if len > MAX_PAYLOAD as u64 {
        return Err(FrameError::TooLarge);
    }
    let header = Header {
        fin: first & 0x80 != 0,
        opcode: first & 0x0F,
        compressed: first & 0x40 != 0,
        len: len as u32,
    };
    if header.opcode & 0x8 != 0 && (!header.fin || len > 125) {
        return Err(FrameError::BadControl);
    }
    Ok(Some((header, used)))
}

/// The header of a client's (masked) frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientHeader {
    /// Final fragment of a message.
    pub fin: bool,
    /// One of the [`opcode`] constants.
    pub opcode: u8,
    /// Header length, mask key included.
    pub header_len: usize,
    /// Payload length (at most [`MAX_PAYLOAD`]).
    pub payload_len: usize,
    /// The masking key.
    pub mask: [u8; 4],
}

/// Parses the header of a client frame at the start of `buf`; `None` if
/// more bytes are needed. Checks what `parse_header` checks, and that
/// the frame is masked.
pub fn parse_client_header(buf: &[u8]) -> Result<Option<ClientHeader>, FrameError> {
    let [first, second, ..] = *buf else {
        return Ok(None);
    };
    if second & 0x80 == 0 {
        return Err(FrameError::Unmasked);
    }
    // The same header without its mask bit and key is a server header.
    let mut plain = [0u8; MAX_HEADER];
    let len = header_len(second & 0x7F)?;
    if buf.len() < len + 4 {
        return Ok(None);
    }
    plain[0] = first;
    plain[1] = second & 0x7F;
    plain[2..len].copy_from_slice(&buf[2..len]);
    let (header, _) = parse_header(&plain[..len])?.expect("complete header");
    // The floor, which reads client frames, negotiates no extension.
    if header.compressed {
        return Err(FrameError::ReservedBits);
    }
    Ok(Some(ClientHeader {
        fin: header.fin,
        opcode: header.opcode,
        header_len: len + 4,
        payload_len: header.len as usize,
        mask: buf[len..len + 4].try_into().expect("four mask bytes"),
    }))
}

/// Unmasks (or masks: the operation is its own inverse) `payload` in place.
/// Four bytes at a time (a byte-wise loop over a cycled key does not
/// vectorize, and the echo client masks every request it sends).
pub fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let key = u32::from_ne_bytes(mask);
    let mut words = payload.chunks_exact_mut(4);
    for word in &mut words {
        let masked = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]) ^ key;
        word.copy_from_slice(&masked.to_ne_bytes());
    }
    for (byte, key) in words.into_remainder().iter_mut().zip(mask) {
        *byte ^= key;
    }
}

/// Appends one final (FIN) frame to `out`, masked with `mask` if given
/// (clients must mask, servers must not).
pub fn encode(out: &mut Vec<u8>, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) {
    encode_frame(out, 0x80 | opcode, payload, mask);
}

/// [`encode`] of a compressed payload: RSV1 set.
pub fn encode_compressed(out: &mut Vec<u8>, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) {
    encode_frame(out, 0x80 | 0x40 | opcode, payload, mask);
}

/// Appends one unmasked (server) frame to `out`, final if `fin`.
pub fn encode_fragment(out: &mut Vec<u8>, fin: bool, opcode: u8, payload: &[u8]) {
    encode_frame(out, if fin { 0x80 } else { 0 } | opcode, payload, None);
}

/// Appends a frame whose first byte is `first` (FIN, RSV1–3, opcode).
fn encode_frame(out: &mut Vec<u8>, first: u8, payload: &[u8], mask: Option<[u8; 4]>) {
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    out.push(first);
    match payload.len() {
        len @ 0..=125 => out.push(mask_bit | len as u8),
        len @ 126..=0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    match mask {
        None => out.extend_from_slice(payload),
        Some(key) => {
            out.extend_from_slice(&key);
            let start = out.len();
            out.extend_from_slice(payload);
            unmask(&mut out[start..], key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame as owned data, for comparing what the reader produced.
    #[derive(Debug, PartialEq, Eq)]
    struct Owned {
        fin: bool,
        opcode: u8,
        payload: Vec<u8>,
    }

    fn read_in_chunks(stream: &[u8], cuts: &[usize]) -> Result<Vec<Owned>, FrameError> {
        let mut reader = FrameReader::new();
        let mut frames = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain(std::iter::once(&stream.len())) {
            reader.feed(&stream[start..end], |f: Frame<'_>| {
                frames.push(Owned {
                    fin: f.fin,
                    opcode: f.opcode,
                    payload: f.payload.to_vec(),
                });
                Ok::<(), FrameError>(())
            })?;
            start = end;
        }
        Ok(frames)
    }

    fn sample_stream() -> (Vec<u8>, Vec<Owned>) {
        let payloads: Vec<(u8, Vec<u8>)> = vec![
            (opcode::TEXT, b"1 123456789 ......................".to_vec()),
            (opcode::PING, Vec::new()),
            (opcode::BINARY, vec![7; 126]),
            (opcode::TEXT, b"x".to_vec()),
            (opcode::BINARY, vec![9; 70_000]),
            (opcode::TEXT, Vec::new()),
        ];
        let mut stream = Vec::new();
        for (op, payload) in &payloads {
            encode(&mut stream, *op, payload, None);
        }
        let expected = payloads
            .into_iter()
            .map(|(opcode, payload)| Owned {
                fin: true,
                opcode,
                payload,
            })
            .collect();
        (stream, expected)
    }

    #[test]
    fn whole_stream_in_one_read() {
        let (stream, expected) = sample_stream();
        assert_eq!(read_in_chunks(&stream, &[]).unwrap(), expected);
    }

    #[test]
    fn every_single_split_point() {
        let (stream, expected) = sample_stream();
        // The 70,000-byte payload makes every cut slow; cut only around headers
        // and within the small frames, which is where the state machine turns.
        let small_end = stream.len() - 70_000 - 10 - 2;
        for cut in (1..small_end + 16).chain(stream.len() - 16..stream.len()) {
            assert_eq!(
                read_in_chunks(&stream, &[cut]).unwrap(),
                expected,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn byte_by_byte() {
        let mut stream = Vec::new();
        encode(&mut stream, opcode::TEXT, &[b'a'; 300], None);
        encode(&mut stream, opcode::TEXT, b"hello", None);
        let cuts: Vec<usize> = (1..stream.len()).collect();
        let frames = read_in_chunks(&stream, &cuts).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].payload, vec![b'a'; 300]);
        assert_eq!(frames[1].payload, b"hello");
    }

    #[test]
    fn two_cuts_inside_a_64_bit_length() {
        let mut stream = Vec::new();
        encode(&mut stream, opcode::BINARY, &[1; 65_536], None);
        let frames = read_in_chunks(&stream, &[3, 7, 9000]).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].payload.len(), 65_536);
    }

    #[test]
    fn fragments_are_reported_as_they_are() {
        let stream = [0x01, 0x02, b'a', b'b', 0x80, 0x01, b'c'];
        let frames = read_in_chunks(&stream, &[3]).unwrap();
        assert_eq!(
            frames,
            vec![
                Owned {
                    fin: false,
                    opcode: opcode::TEXT,
                    payload: b"ab".to_vec()
                },
                Owned {
                    fin: true,
                    opcode: opcode::CONTINUATION,
                    payload: b"c".to_vec()
                },
            ]
        );
    }

    #[test]
    fn rejects_masked_reserved_and_bad_control_frames() {
        assert_eq!(
            read_in_chunks(&[0x81, 0x81, 1, 2, 3, 4, 0], &[]),
            Err(FrameError::Masked)
        );
        assert_eq!(read_in_chunks(&[0x81], &[]).unwrap(), vec![]);
        assert_eq!(
            read_in_chunks(&[0xA1, 0x00], &[1]),
            Err(FrameError::ReservedBits)
        );
        assert_eq!(
            read_in_chunks(&[0xC9, 0x00], &[]),
            Err(FrameError::ReservedBits),
            "RSV1 on a ping"
        );
        let mut compressed = Vec::new();
        encode_compressed(&mut compressed, opcode::TEXT, b"xy", None);
        assert_eq!(compressed, [0xC1, 0x02, b'x', b'y']);
        let mut seen = Vec::new();
        FrameReader::new()
            .feed(&compressed, |f| {
                seen.push((f.compressed, f.payload.to_vec()));
                Ok::<_, FrameError>(())
            })
            .unwrap();
        assert_eq!(seen, [(true, b"xy".to_vec())]);
        assert_eq!(
            read_in_chunks(&[0x09, 0x00], &[]),
            Err(FrameError::BadControl)
        );
        assert_eq!(
            read_in_chunks(&[0x89, 126, 0, 126], &[]),
            Err(FrameError::BadControl)
        );
        let mut huge = vec![0x82, 127];
        huge.extend_from_slice(&(MAX_PAYLOAD as u64 + 1).to_be_bytes());
        assert_eq!(read_in_chunks(&huge, &[5]), Err(FrameError::TooLarge));
    }

    #[test]
    fn callback_errors_stop_the_reader() {
        let mut stream = Vec::new();
        encode(&mut stream, opcode::TEXT, b"one", None);
        encode(&mut stream, opcode::TEXT, b"two", None);
        let mut seen = 0;
        let result = FrameReader::new().feed(&stream, |_| {
            seen += 1;
            Err(FrameError::BadControl)
        });
        assert_eq!(result, Err(FrameError::BadControl));
        assert_eq!(seen, 1);
    }

    #[test]
    fn client_headers_and_unmasking() {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        for len in [0usize, 5, 125, 126, 65_535, 65_536] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut wire = Vec::new();
            encode(&mut wire, opcode::BINARY, &payload, Some(mask));
            let header = parse_client_header(&wire).unwrap().unwrap();
            assert_eq!(
                header.header_len + header.payload_len,
                wire.len(),
                "len {len}"
            );
            assert_eq!(
                (header.fin, header.opcode, header.mask),
                (true, opcode::BINARY, mask)
            );
            for cut in 0..header.header_len {
                assert_eq!(parse_client_header(&wire[..cut]), Ok(None), "cut {cut}");
            }
            let body = &mut wire[header.header_len..];
            unmask(body, header.mask);
            assert_eq!(body, &payload[..]);
        }
        // RFC 6455 section 5.7: "Hello" masked with 37 fa 21 3d.
        let mut hello = *b"Hello";
        unmask(&mut hello, mask);
        assert_eq!(hello, [0x7f, 0x9f, 0x4d, 0x51, 0x58]);
        let mut unmasked = Vec::new();
        encode(&mut unmasked, opcode::TEXT, b"hi", None);
        assert_eq!(parse_client_header(&unmasked), Err(FrameError::Unmasked));
        assert_eq!(
            parse_client_header(&[0x89, 0xFE, 0, 200, 1, 2, 3, 4]),
            Err(FrameError::BadControl)
        );
    }

    #[test]
    fn encodes_lengths_and_masks() {
        let mut out = Vec::new();
        encode(&mut out, opcode::TEXT, b"Hello", None);
        assert_eq!(out, [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]); // RFC 6455 §5.7
        out.clear();
        encode(
            &mut out,
            opcode::TEXT,
            b"Hello",
            Some([0x37, 0xfa, 0x21, 0x3d]),
        );
        assert_eq!(
            out,
            [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58]
        );
        out.clear();
        encode(&mut out, opcode::BINARY, &[0; 256], None);
        assert_eq!(out[..4], [0x82, 0x7E, 0x01, 0x00]);
        out.clear();
        encode(&mut out, opcode::BINARY, &[0; 65_536], None);
        assert_eq!(out[..10], [0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0]);
        out.clear();
        encode_fragment(&mut out, false, opcode::TEXT, b"Hel");
        assert_eq!(out, [0x01, 0x03, 0x48, 0x65, 0x6c]); // RFC 6455 §5.7
    }
}
