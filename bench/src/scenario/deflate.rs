//! `deflate`: the DEFLATE implementations a permessage-deflate server can
//! use, measured on the same feed of JSON messages: each message
//! compressed on its own (no context takeover, as a broadcast compressed
//! once for every connection must be); and the messages a client sends,
//! compressed as browsers do (zlib, a sync flush each, its tail dropped),
//! inflated again and compared.
//!
//! Candidates: `flate2` over zlib-rs (streaming, any window size),
//! `miniz_oxide` (flate2's default backend; 32 KiB window only) and
//! `libdeflater` (libdeflate, whole buffers only; 32 KiB window only).
//! Each compresses at its fastest level and at its default one.

use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

use crate::wire::feed::feed;
use crate::Error;

/// The tail a sync flush leaves, which permessage-deflate drops from each
/// message (RFC 7692 §7.2.1) and the receiver appends again.
const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Options of `deflate`.
#[derive(Debug, Clone, clap::Args)]
pub struct DeflateOptions {
    /// Messages in the feed.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Price levels per side in each message (25 make about 1 KB).
    #[arg(long, default_value_t = 25)]
    pub levels: usize,
    /// The compression levels each candidate is measured at.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 6])]
    pub compress_levels: Vec<u32>,
}

/// One candidate at one level.
#[derive(Debug, Clone, Serialize)]
pub struct DeflateRow {
    /// The implementation.
    pub implementation: &'static str,
    /// Its compression level.
    pub level: u32,
    /// Compressed bytes over original bytes.
    pub ratio: f64,
    /// Compression time per message, in µs.
    pub compress_us: f64,
    /// Inflation time per client message (the same for every level), in µs.
    pub inflate_us: f64,
}

/// A `deflate` run.
#[derive(Debug, Clone, Serialize)]
pub struct DeflateRun {
    /// Messages in the feed.
    pub messages: usize,
    /// Their mean size, in bytes.
    pub mean_bytes: f64,
    /// One row per candidate and level.
    pub rows: Vec<DeflateRow>,
}

impl DeflateRun {
    /// The run as a table.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "deflate: {} JSON messages of {:.0} B on average, each compressed alone and inflated again\n",
            self.messages, self.mean_bytes
        );
        let _ = writeln!(
            out,
            "  {:<22} {:>5} {:>8} {:>13} {:>12}",
            "implementation", "level", "ratio", "compress µs", "inflate µs"
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "  {:<22} {:>5} {:>8.3} {:>13.2} {:>12.2}",
                r.implementation, r.level, r.ratio, r.compress_us, r.inflate_us
            );
        }
        out
    }
}

/// Measures every candidate on the feed.
pub fn run(o: &DeflateOptions) -> Result<DeflateRun, Error> {
    if o.messages == 0 || o.levels == 0 {
        return Err("--messages and --levels must be positive".into());
    }
    if o.compress_levels.iter().any(|&l| !(1..=9).contains(&l)) {
        return Err("--compress-levels are 1 to 9".into());
    }
    let feed = feed(o.messages, o.levels);
    let total: usize = feed.iter().map(Vec::len).sum();
    let mut rows = Vec::new();
    // What clients send: zlib's sync-flushed messages at its default level.
    let mut reference = zlib_rs::codec(6);
    let sent: Vec<Vec<u8>> = feed
        .iter()
        .map(|message| {
            let mut out = Vec::new();
            (reference.compress)(message, &mut out);
            out
        })
        .collect();
    for &level in &o.compress_levels {
        let candidates = [
            ("flate2 (zlib-rs)", zlib_rs::codec(level)),
            ("miniz_oxide", miniz::codec(level)),
            ("libdeflater", libdeflate::codec(level)),
        ];
        for (name, codec) in candidates {
            rows.push(measure(name, level, &feed, &sent, total, codec)?);
        }
    }
    Ok(DeflateRun {
        messages: o.messages,
        mean_bytes: total as f64 / o.messages as f64,
        rows,
    })
}

/// Compresses one message alone into `out` (permessage-deflate's
/// payload), and inflates one back into `out` (at most `limit` bytes).
struct Codec {
    compress: Box<Compressing>,
    inflate: Box<Inflating>,
}

/// Compresses a message into the buffer.
type Compressing = dyn FnMut(&[u8], &mut Vec<u8>);
/// Inflates a payload of at most so many bytes into the buffer.
type Inflating = dyn FnMut(&[u8], usize, &mut Vec<u8>) -> Result<(), String>;

/// Compresses `feed` with `codec`, and inflates `sent` (the feed as
/// clients send it) with it.
fn measure(
    implementation: &'static str,
    level: u32,
    feed: &[Vec<u8>],
    sent: &[Vec<u8>],
    total: usize,
    mut codec: Codec,
) -> Result<DeflateRow, Error> {
    let mut compressed: Vec<Vec<u8>> = Vec::with_capacity(feed.len());
    let started = Instant::now();
    for message in feed {
        let mut out = Vec::with_capacity(message.len());
        (codec.compress)(message, &mut out);
        compressed.push(out);
    }
    let compress = started.elapsed();
    let mut out = Vec::new();
    let started = Instant::now();
    for (payload, message) in sent.iter().zip(feed) {
        (codec.inflate)(payload, message.len() * 2, &mut out)?;
        if out != *message {
            return Err(
                format!("{implementation} level {level}: a message came back different").into(),
            );
        }
    }
    let inflate = started.elapsed();
    let bytes: usize = compressed.iter().map(Vec::len).sum();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / feed.len() as f64;
    Ok(DeflateRow {
        implementation,
        level,
        ratio: bytes as f64 / total as f64,
        compress_us: per(compress),
        inflate_us: per(inflate),
    })
}

/// The payload with the sync-flush tail put back, as a receiver inflates it.
fn with_tail(payload: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(payload.len() + SYNC_TAIL.len());
    data.extend_from_slice(payload);
    data.extend_from_slice(&SYNC_TAIL);
    data
}

mod zlib_rs {
    use super::{with_tail, Codec, SYNC_TAIL};
    use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

    pub fn codec(level: u32) -> Codec {
        let mut compressor = Compress::new(Compression::new(level), false);
        let mut inflater = Decompress::new(false);
        Codec {
            compress: Box::new(move |message, out| {
                compressor.reset();
                out.reserve(message.len() + 64);
                compressor
                    .compress_vec(message, out, FlushCompress::Sync)
                    .expect("room reserved");
                debug_assert!(out.ends_with(&SYNC_TAIL));
                out.truncate(out.len() - SYNC_TAIL.len());
            }),
            inflate: Box::new(move |payload, limit, out| {
                inflater.reset(false);
                out.clear();
                out.reserve(limit);
                let data = with_tail(payload);
                match inflater.decompress_vec(&data, out, FlushDecompress::Sync) {
                    Ok(Status::Ok | Status::StreamEnd | Status::BufError) => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            }),
        }
    }
}

mod miniz {
    use super::{with_tail, Codec, SYNC_TAIL};
    use miniz_oxide::deflate::core::{
        compress_to_output, create_comp_flags_from_zip_params, CompressorOxide, TDEFLFlush,
    };
    use miniz_oxide::inflate::core::{decompress, inflate_flags, DecompressorOxide};

    pub fn codec(level: u32) -> Codec {
        let flags = create_comp_flags_from_zip_params(level as i32, 0, 0);
        let mut compressor = CompressorOxide::new(flags);
        let mut inflater = Box::<DecompressorOxide>::default();
        Codec {
            compress: Box::new(move |message, out| {
                compressor.reset();
                let (_, used) =
                    compress_to_output(&mut compressor, message, TDEFLFlush::Sync, |bytes| {
                        out.extend_from_slice(bytes);
                        true
                    });
                debug_assert_eq!(used, message.len());
                debug_assert!(out.ends_with(&SYNC_TAIL));
                out.truncate(out.len() - SYNC_TAIL.len());
            }),
            inflate: Box::new(move |payload, limit, out| {
                inflater.init();
                out.clear();
                out.resize(limit, 0);
                let data = with_tail(payload);
                // The stream has no final block: more input "may" follow.
                let flags = inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF
                    | inflate_flags::TINFL_FLAG_HAS_MORE_INPUT;
                let (status, used, written) = decompress(&mut inflater, &data, out, 0, flags);
                out.truncate(written);
                match status as i32 {
                    s if s >= 0 && used == data.len() => Ok(()),
                    s => Err(format!(
                        "miniz_oxide status {s}, {used} of {} bytes",
                        data.len()
                    )),
                }
            }),
        }
    }
}

mod libdeflate {
    use super::Codec;
    use libdeflater::{CompressionLvl, Compressor, Decompressor};

    /// The sync flush's tail and an empty final stored block: it ends the
    /// stream a sync flush left open, which libdeflate's whole-buffer
    /// inflater needs.
    const FINAL_EMPTY: [u8; 9] = [0x00, 0x00, 0xff, 0xff, 0x01, 0x00, 0x00, 0xff, 0xff];

    pub fn codec(level: u32) -> Codec {
        let lvl = CompressionLvl::new(level as i32).expect("a valid level");
        let mut compressor = Compressor::new(lvl);
        let mut inflater = Decompressor::new();
        Codec {
            // A complete stream, its last block final (allowed by RFC 7692
            // §7.2.3.4), sent as it is.
            compress: Box::new(move |message, out| {
                out.resize(compressor.deflate_compress_bound(message.len()), 0);
                let n = compressor.deflate_compress(message, out).expect("bound");
                out.truncate(n);
            }),
            inflate: Box::new(move |payload, limit, out| {
                let mut data = payload.to_vec();
                data.extend_from_slice(&FINAL_EMPTY);
                out.clear();
                out.resize(limit, 0);
                match inflater.deflate_decompress(&data, out) {
                    Ok(n) => {
                        out.truncate(n);
                        Ok(())
                    }
                    Err(e) => Err(format!("libdeflate: {e:?}")),
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_gives_every_message_back() {
        let run = run(&DeflateOptions {
            messages: 50,
            levels: 25,
            compress_levels: vec![1, 6],
        })
        .unwrap();
        assert_eq!(run.rows.len(), 6);
        for row in &run.rows {
            assert!(row.ratio > 0.05 && row.ratio < 0.9, "{row:?}");
        }
        assert!(
            (800.0..1400.0).contains(&run.mean_bytes),
            "{}",
            run.mean_bytes
        );
    }
}
