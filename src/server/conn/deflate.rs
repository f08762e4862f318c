//! permessage-deflate on a connection: what it negotiated, its compressed
//! messages inflated, and its echoes and broadcasts sent compressed. The
//! work space for all of it is the loop's, one for every connection: a
//! connection holds only its one-byte [`DeflateUse`].

use super::{Conn, Ctx, Verdict};
use crate::protocol::deflate::{Agreed, MAX_WINDOW_BITS};
use crate::protocol::ws::compress::{deflate_into, Level};
use crate::protocol::ws::inflate::{InflateError, Inflater};
use crate::protocol::ws::{MessageKind, ProtocolError};
use crate::server::key::ConnKey;

/// What permessage-deflate gives a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeflateUse {
    /// Not negotiated.
    Off,
    /// Negotiated with a window under 32 KiB (`server_max_window_bits`):
    /// its compressed messages are inflated, but what it is sent goes
    /// plain, since the loop compresses with a 32 KiB window.
    Inflate,
    /// Negotiated: it inflates, and gets compressed broadcasts and echoes.
    Full,
}

impl DeflateUse {
    /// What `agreed` gives.
    pub fn of(agreed: Option<&Agreed>) -> DeflateUse {
        match agreed {
            None => DeflateUse::Off,
            Some(a) if a.server_window_bits < MAX_WINDOW_BITS => DeflateUse::Inflate,
            Some(_) => DeflateUse::Full,
        }
    }
}

/// The loop's permessage-deflate work space, its buffers' capacity kept
/// between messages (each at most about `--max-message-bytes`).
#[derive(Debug, Default)]
pub struct DeflateScratch {
    /// The one inflater of compressed client messages.
    inflater: Inflater,
    /// Where a compressed client message is inflated.
    inflated: Vec<u8>,
    /// Where an echo is compressed.
    compressed: Vec<u8>,
}

impl Conn {
    /// A whole data message as it came: inflated first if compressed (at
    /// most `--max-message-bytes`, its text then checked), then handled.
    pub(super) fn on_whole(
        &mut self,
        key: ConnKey,
        kind: MessageKind,
        payload: &[u8],
        compressed: bool,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if !compressed {
            return self.on_message(key, kind, payload, ctx);
        }
        let limit = usize::try_from(ctx.config.max_message_bytes).unwrap_or(usize::MAX);
        let mut inflated = std::mem::take(&mut ctx.deflate.inflated);
        let verdict = match ctx.deflate.inflater.inflate(payload, limit, &mut inflated) {
            Err(InflateError::TooBig) => self.fail(key, ProtocolError::MessageTooBig, ctx),
            Err(InflateError::Corrupt) => self.fail(key, ProtocolError::BadCompressedData, ctx),
            Ok(()) if kind == MessageKind::Text && std::str::from_utf8(&inflated).is_err() => {
                self.fail(key, ProtocolError::InvalidUtf8, ctx)
            }
            Ok(()) if ctx.config.echo || ctx.upstream.is_some() => {
                self.on_message(key, kind, &inflated, ctx)
            }
            Ok(()) => Verdict::Keep,
        };
        ctx.deflate.inflated = inflated;
        verdict
    }

    /// Echoes `message`: compressed ([`Level::Single`]: it is for this
    /// connection alone) when this connection gets compressed frames and
    /// the message is at least `--deflate-min-bytes`.
    pub(super) fn echo(&mut self, kind: MessageKind, message: &[u8], ctx: &mut Ctx<'_>) -> Verdict {
        let worth_it = message.len() >= ctx.config.deflate_min_bytes;
        if self.deflate != DeflateUse::Full || !worth_it {
            return self.reply(kind.opcode(), message, false, ctx);
        }
        let mut compressed = std::mem::take(&mut ctx.deflate.compressed);
        deflate_into(message, Level::Single, &mut compressed);
        let verdict = self.reply(kind.opcode(), &compressed, true, ctx);
        ctx.deflate.compressed = compressed;
        verdict
    }
}
