//! Standard input to the loop. In `lines` mode each line, judged by the
//! rules of [`wspush::protocol::lines`], is broadcast; in `commands` mode
//! each line is a [`wspush::Command`]. Either way the work goes through a
//! [`Handle`], and a skipped line is logged with its number and counted in
//! `input_lines_rejected`. End of input ends
//! the pump, not the server. An instance of a supervisor also takes the
//! supervisor's control lines ([`crate::sources`]) from its input.
//!
//! Input lines are numbered from the first line's number on (control
//! lines apart), and a line's messages get its number as their position:
//! every instance of a supervisor reads the same lines, so every instance
//! gives the same line the same position.

use std::io::{self, BufRead};
use std::ops::ControlFlow;

use crate::sources::{Control, CONTROL};
use wspush::protocol::lines::{Line, Lines};
use wspush::{
    BroadcastError, Command, Handle, MessageKind, Payload, Recipients, ServerGone, SharedHistory,
};

/// What a line of input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputMode {
    /// Each line is a text message to every connection.
    Lines,
    /// Each line is a command (see the README).
    Commands,
}

/// How reading the input ended.
#[derive(Debug)]
pub enum PumpEnd {
    /// End of input.
    Eof,
    /// The server loop stopped.
    ServerGone,
    /// Reading failed.
    Failed(io::Error),
}

/// The longest line read in `mode` for messages of `max_message_bytes`:
/// in commands mode the payload may be base64 (4/3 as long) after a
/// verb and up to 64 KiB of names.
pub fn max_line_bytes(mode: InputMode, max_message_bytes: usize) -> usize {
    match mode {
        InputMode::Lines => max_message_bytes,
        InputMode::Commands => max_message_bytes.div_ceil(3) * 4 + (64 << 10),
    }
}

/// Reads `input` to its end, handing each line to `handle` in order, as
/// `mode` says, numbered from `first_line` (`None`: the loop gives the
/// next positions); lines longer than `max_line_bytes` are skipped. With
/// `controlled` (an instance reading its supervisor), control lines are
/// carried out.
pub fn pump(
    mut input: impl BufRead,
    handle: &Handle,
    mode: InputMode,
    max_line_bytes: usize,
    controlled: bool,
    first_line: Option<u64>,
) -> PumpEnd {
    let mut lines = Lines::new(max_line_bytes);
    let mut pump = Pump {
        handle,
        mode,
        max_line_bytes,
        controlled,
        first_line,
        controls: 0,
    };
    loop {
        let chunk = match input.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return PumpEnd::Failed(e),
        };
        if chunk.is_empty() {
            return match lines.finish(|number, line| pump.line(number, line)) {
                ControlFlow::Break(end) => end,
                ControlFlow::Continue(()) => PumpEnd::Eof,
            };
        }
        let read = chunk.len();
        if let ControlFlow::Break(end) = lines.push(chunk, |number, line| pump.line(number, line)) {
            return end;
        }
        input.consume(read);
    }
}

/// What the pump carries from one line to the next.
struct Pump<'h> {
    handle: &'h Handle,
    mode: InputMode,
    max_line_bytes: usize,
    controlled: bool,
    first_line: Option<u64>,
    /// Control lines so far: they take no position.
    controls: u64,
}

impl Pump<'_> {
    /// Carries out input line `number`; breaks when the server is gone.
    fn line(&mut self, number: u64, line: Line<'_>) -> ControlFlow<PumpEnd> {
        let handle = self.handle;
        let text = match line {
            Line::Text(text) => text,
            Line::TooLong => {
                let limit = match self.mode {
                    InputMode::Lines => "message",
                    InputMode::Commands => "command line",
                };
                let why = format!("longer than the {}-byte {limit} limit", self.max_line_bytes);
                reject(handle, number, &why);
                return ControlFlow::Continue(());
            }
            Line::NotUtf8(bytes) => {
                match Control::parse(bytes) {
                    Some(control) if self.controlled => {
                        self.controls += 1;
                        carry_out_control(handle, control)
                    }
                    _ if self.controlled && bytes.first() == Some(&CONTROL) => {
                        reject(handle, number, "not a control line")
                    }
                    _ => reject(handle, number, "not valid UTF-8"),
                }
                return ControlFlow::Continue(());
            }
        };
        let seq = self
            .first_line
            .map(|first| (first + number).saturating_sub(1 + self.controls));
        let done = match interpret(self.mode, text) {
            Ok(Interpreted::Message(to, kind, payload)) => send(handle, seq, to, kind, payload),
            Ok(Interpreted::Command(command)) => carry_out(handle, command),
            Err(e) => {
                reject(handle, number, &e);
                return ControlFlow::Continue(());
            }
        };
        match done {
            Ok(()) => {}
            Err(BroadcastError::Gone(ServerGone)) => {
                return ControlFlow::Break(PumpEnd::ServerGone)
            }
            // Counted and logged by the handle (over the message limit).
            Err(BroadcastError::TooBig(_)) => {}
            Err(e) => reject(handle, number, &e.to_string()),
        }
        ControlFlow::Continue(())
    }
}

/// Sends a message of line `seq` (if numbered).
fn send(
    handle: &Handle,
    seq: Option<u64>,
    to: Recipients,
    kind: MessageKind,
    payload: Vec<u8>,
) -> Result<(), BroadcastError> {
    match seq {
        Some(seq) => handle.send_at(seq, to, kind, payload),
        None => handle.send(to, kind, payload),
    }
}

/// What a line of input asks for.
enum Interpreted<'a> {
    /// A message: whom to, text or binary, the payload.
    Message(Recipients, MessageKind, Vec<u8>),
    /// Another command (a subscription change, a close).
    Command(Command<'a>),
}

/// What the line `text` asks for in `mode`, or why it is not valid.
fn interpret(mode: InputMode, text: &str) -> Result<Interpreted<'_>, String> {
    let command = match mode {
        InputMode::Lines => {
            let payload = text.as_bytes().to_vec();
            return Ok(Interpreted::Message(
                Recipients::All,
                MessageKind::Text,
                payload,
            ));
        }
        InputMode::Commands => Command::parse(text).map_err(|e| e.to_string())?,
    };
    let Command::Send { to, payload } = command else {
        return Ok(Interpreted::Command(command));
    };
    Ok(match payload {
        Payload::Text(text) => Interpreted::Message(to, MessageKind::Text, text.into()),
        Payload::Binary(bytes) => Interpreted::Message(to, MessageKind::Binary, bytes),
    })
}

/// Hands a command other than a message to the loop.
fn carry_out(handle: &Handle, command: Command<'_>) -> Result<(), BroadcastError> {
    match command {
        Command::Send { .. } => unreachable!("messages are interpreted apart"),
        Command::Subscribe { id, channels } => Ok(handle.subscribe(id, channels)?),
        Command::Unsubscribe { id, channels } => Ok(handle.unsubscribe(id, channels)?),
        Command::Close { who, code, reason } => handle.close(who, code, reason),
    }
}

/// What a supervisor keeps of its input for its instances: every message,
/// framed with its position (its line's number), in the host's history.
#[derive(Debug)]
pub struct Recorder {
    history: SharedHistory,
    mode: InputMode,
    max_line_bytes: usize,
    max_message_bytes: usize,
}

impl Recorder {
    /// Keeps the messages of input read in `mode` in `history`.
    pub fn new(
        history: SharedHistory,
        mode: InputMode,
        max_line_bytes: usize,
        max_message_bytes: usize,
    ) -> Recorder {
        Recorder {
            history,
            mode,
            max_line_bytes,
            max_message_bytes,
        }
    }

    /// The history's descriptor, for the instances to inherit.
    pub fn inheritable_fd(&self) -> io::Result<i32> {
        self.history.inheritable_fd()
    }

    /// Keeps the messages of `chunk` (whole lines, the first numbered
    /// `first`), judged as an instance judges them.
    pub fn record(&mut self, chunk: &[u8], first: u64) {
        let mut lines = Lines::new(self.max_line_bytes);
        let mut keep = |number: u64, line: Line<'_>| {
            let Line::Text(text) = line else {
                return ControlFlow::<()>::Continue(());
            };
            if let Ok(Interpreted::Message(to, kind, payload)) = interpret(self.mode, text) {
                if payload.len() <= self.max_message_bytes {
                    self.history.append(first + number - 1, &to, kind, &payload);
                }
            }
            ControlFlow::Continue(())
        };
        let _ = lines.push(chunk, &mut keep);
        let _ = lines.finish(&mut keep);
    }

    /// Drops what is older than the history's age bound.
    pub fn evict(&mut self) {
        self.history.evict();
    }
}

/// Carries out what the supervisor says.
fn carry_out_control(handle: &Handle, control: Control) {
    match control {
        Control::FeedLost => handle.feed_lost(),
        Control::FeedRestored(outage) => handle.feed_restored(outage),
    }
}

fn reject(handle: &Handle, number: u64, why: &str) {
    handle.count_rejected_input();
    log::warn!("input line {number} skipped: {why}");
}
