//! The input to the loop: the lines of the sources ([`crate::sources`])
//! as a lone server merges them, or as an instance reads them from its
//! supervisor. In `lines` mode each line, judged by the rules of
//! [`wspush::protocol::lines`], is broadcast; in `commands` mode each line
//! is a [`wspush::Command`]. Either way the work goes through a
//! [`Handle`], and a skipped line is logged with its number and counted in
//! `input_lines_rejected`. End of input ends the pump, not the server.
//! Control lines ([`crate::sources`]) are carried out.
//!
//! Input lines are split, judged and numbered by one rule,
//! [`InputLines`]: every line but a control line takes the next number,
//! skipped or not, and a line's messages get its number as their
//! position. A lone server numbers from
//! 1; a supervisor numbers the same way as it records the history, and
//! tells each instance it starts where to begin, so every instance gives
//! the same line the same number, in its positions and its warnings.

use std::io::{self, BufRead};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, IntoRawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::asks::AnswerTo;
use crate::chunks::{Control, CONTROL, CONTROL_MAX_LEN};
use wspush::protocol::lines::{Line, Lines};
use wspush::{
    BroadcastError, Command, Config, Handle, MessageKind, Payload, Recipients, ServerGone,
    SharedHistory,
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

/// How often the history's messages older than its age bound are dropped.
pub const EVICT_EVERY: Duration = Duration::from_secs(1);

/// The input's lines, split, judged by the rules of
/// [`wspush::protocol::lines`] and numbered: each line but a control line
/// takes the next number, whether it is acted on or skipped. A line's
/// number is its messages' position. A stream entry's control line
/// ([`Control::Entry`]) sets the number of its lines, which follow it. A
/// control line is known whatever the line limit (it is at most
/// [`CONTROL_MAX_LEN`] bytes).
#[derive(Debug)]
pub struct InputLines {
    lines: Lines,
    numbering: Numbering,
}

/// How the next lines are numbered.
#[derive(Debug)]
struct Numbering {
    max_line_bytes: usize,
    max_command_bytes: usize,
    next: u64,
    /// Lines left of the stream entry under way, and whether they are
    /// for the history only.
    entry: Option<(u32, bool)>,
    /// Lines left of a publish request's commands.
    commands: u32,
}

/// A line of input as [`InputLines`] hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Numbered<'a> {
    /// A control line: it takes no number (`None`: not one this version
    /// knows).
    Control(Option<Control>),
    /// A line and its number.
    Line(u64, Line<'a>),
    /// A command line whatever the input's mode (a publish request's),
    /// and its number.
    Command(u64, Line<'a>),
    /// A line for the history only (a stream's tail, read at the start),
    /// and its number.
    Kept(u64, Line<'a>),
}

impl InputLines {
    /// Lines longer than `max_line_bytes` are too long, and command lines
    /// (see [`Control::Commands`]) longer than `max_command_bytes`; the
    /// first is numbered `first`.
    pub fn new(max_line_bytes: usize, max_command_bytes: usize, first: u64) -> InputLines {
        let split = max_line_bytes.max(max_command_bytes).max(CONTROL_MAX_LEN);
        InputLines {
            lines: Lines::new(split),
            numbering: Numbering {
                max_line_bytes,
                max_command_bytes,
                next: first,
                entry: None,
                commands: 0,
            },
        }
    }

    /// The number the next line takes.
    pub fn next(&self) -> u64 {
        self.numbering.next
    }

    /// Calls `each` with every line `bytes` ends, until it breaks.
    pub fn push<B>(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(Numbered<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let numbering = &mut self.numbering;
        self.lines
            .push(bytes, |_, line| each(numbering.number(line)))
    }

    /// The input ended: hands over the line begun, if any.
    pub fn finish<B>(
        &mut self,
        mut each: impl FnMut(Numbered<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let numbering = &mut self.numbering;
        self.lines.finish(|_, line| each(numbering.number(line)))
    }
}

impl Numbering {
    fn number<'a>(&mut self, line: Line<'a>) -> Numbered<'a> {
        let len = match line {
            Line::NotUtf8(bytes @ [CONTROL, ..]) => {
                let control = Control::parse(bytes);
                match control {
                    Some(Control::Entry { seq, lines, keep }) => {
                        self.next = seq;
                        self.entry = (lines > 0).then_some((lines, keep));
                    }
                    Some(Control::Commands { lines }) => self.commands = lines,
                    _ => {}
                }
                return Numbered::Control(control);
            }
            Line::Text(text) => text.len(),
            Line::NotUtf8(bytes) => bytes.len(),
            Line::TooLong => 0,
        };
        let number = self.next;
        self.next += 1;
        let command = self.commands > 0;
        self.commands = self.commands.saturating_sub(1);
        let limit = match command {
            true => self.max_command_bytes,
            false => self.max_line_bytes,
        };
        let line = if len > limit { Line::TooLong } else { line };
        if command {
            return Numbered::Command(number, line);
        }
        let kept = match &mut self.entry {
            Some((left, keep)) => {
                let kept = *keep;
                *left -= 1;
                if *left == 0 {
                    self.entry = None;
                }
                kept
            }
            None => false,
        };
        match kept {
            true => Numbered::Kept(number, line),
            false => Numbered::Line(number, line),
        }
    }
}

/// Reads `input` to its end, handing each line to `handle` in order, as
/// `mode` says (a publish request's lines as commands), numbered from
/// `first_line`; lines longer than `mode` takes for messages of
/// `max_message_bytes` are skipped; control lines are carried out.
pub fn pump(
    mut input: impl BufRead,
    (handle, answer_to): (&Handle, &AnswerTo),
    mode: InputMode,
    max_message_bytes: usize,
    first_line: u64,
) -> PumpEnd {
    let limits = LineLimits::new(mode, max_message_bytes);
    let mut lines = limits.lines(first_line);
    let mut pump = Pump {
        handle,
        answer_to,
        mode,
        limits,
    };
    loop {
        let chunk = match input.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return PumpEnd::Failed(e),
        };
        if chunk.is_empty() {
            return match lines.finish(|line| pump.line(line)) {
                ControlFlow::Break(end) => end,
                ControlFlow::Continue(()) => PumpEnd::Eof,
            };
        }
        let read = chunk.len();
        if let ControlFlow::Break(end) = lines.push(chunk, |line| pump.line(line)) {
            return end;
        }
        input.consume(read);
    }
}

/// The longest lines of input taken: in the input's mode, and commands.
#[derive(Debug, Clone, Copy)]
pub struct LineLimits {
    /// A line in the input's mode.
    pub line: usize,
    /// A command line (a publish request's).
    pub command: usize,
}

impl LineLimits {
    /// The limits in `mode` for messages of `max_message_bytes`.
    pub fn new(mode: InputMode, max_message_bytes: usize) -> LineLimits {
        LineLimits {
            line: max_line_bytes(mode, max_message_bytes),
            command: max_line_bytes(InputMode::Commands, max_message_bytes),
        }
    }

    /// The input's lines judged by these limits, numbered from `first`.
    pub fn lines(self, first: u64) -> InputLines {
        InputLines::new(self.line, self.command, first)
    }

    /// The limit of a line read in `mode`.
    fn of(self, mode: InputMode) -> usize {
        match mode {
            InputMode::Lines => self.line,
            InputMode::Commands => self.command,
        }
    }
}

/// What the pump carries from one line to the next.
struct Pump<'h> {
    handle: &'h Handle,
    /// Where the loop's answers to presence questions go.
    answer_to: &'h AnswerTo,
    mode: InputMode,
    limits: LineLimits,
}

impl Pump<'_> {
    /// Carries out the next input line; breaks when the server is gone.
    fn line(&mut self, line: Numbered<'_>) -> ControlFlow<PumpEnd> {
        let handle = self.handle;
        let (number, line, mode) = match line {
            Numbered::Line(number, line) => (number, line, self.mode),
            Numbered::Command(number, line) => (number, line, InputMode::Commands),
            Numbered::Kept(number, _) => {
                return match handle.advance_to(number) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(ServerGone) => ControlFlow::Break(PumpEnd::ServerGone),
                };
            }
            Numbered::Control(control) => {
                let carried = match control {
                    Some(control) => carry_out_control(handle, self.answer_to, control),
                    None => {
                        handle.count_rejected_input();
                        log::warn!("a control line skipped: not one this version knows");
                        Ok(())
                    }
                };
                return match carried {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(ServerGone) => ControlFlow::Break(PumpEnd::ServerGone),
                };
            }
        };
        let text = match line {
            Line::Text(text) => text,
            Line::TooLong => {
                let limit = match mode {
                    InputMode::Lines => "message",
                    InputMode::Commands => "command line",
                };
                let why = format!(
                    "longer than the {}-byte {limit} limit",
                    self.limits.of(mode)
                );
                reject(handle, number, &why);
                return ControlFlow::Continue(());
            }
            Line::NotUtf8(_) => {
                reject(handle, number, "not valid UTF-8");
                return ControlFlow::Continue(());
            }
        };
        let done = match interpret(mode, text) {
            Ok(Interpreted::Message(to, kind, payload)) => {
                handle.send_at(number, to, kind, payload)
            }
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

/// The history a [`Recorder`] writes, as it goes to this process's next
/// image (see [`Recorder::keep_for_next_image`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeptHistory {
    /// Its memory's descriptor, open across the exec.
    pub fd: i32,
    /// Its records' ages (ms, oldest first).
    pub ages_ms: Vec<u64>,
    /// The last position it gave out.
    pub last: u64,
    /// The number of the next input line.
    pub next_line: u64,
}

/// What a supervisor keeps of its input for its instances: every message,
/// framed with its position (its line's number), in the host's history.
#[derive(Debug)]
pub struct Recorder {
    history: SharedHistory,
    mode: InputMode,
    max_message_bytes: usize,
    /// The input as an instance reads it, numbered from 1.
    lines: InputLines,
    /// A descriptor of the history made at the start, for this process's
    /// next image: a re-exec needs no new descriptor (none may be left).
    spare: Option<std::os::fd::OwnedFd>,
}

impl Recorder {
    /// Keeps the messages of input read in `mode` in `history`.
    pub fn new(
        history: SharedHistory,
        mode: InputMode,
        max_message_bytes: usize,
    ) -> io::Result<Recorder> {
        Ok(Recorder {
            spare: Some(history.reader_fd()?),
            history,
            mode,
            max_message_bytes,
            lines: LineLimits::new(mode, max_message_bytes).lines(1),
        })
    }

    /// Goes on with the history as an earlier image of this process left
    /// it (`kept`), within `config`'s bounds, numbering on from there.
    pub fn resumed(
        kept: &KeptHistory,
        config: &Config,
        mode: InputMode,
    ) -> Result<Recorder, String> {
        let fd =
            wspush::sys::adopt_fd(kept.fd).map_err(|e| format!("cannot take the history: {e}"))?;
        let ages: Vec<Duration> = kept
            .ages_ms
            .iter()
            .map(|&ms| Duration::from_millis(ms))
            .collect();
        let history = SharedHistory::resumed(config, fd, &ages, kept.last)
            .map_err(|e| format!("cannot go on with the history: {e}"))?;
        let max_message_bytes = config.max_message_bytes as usize;
        Ok(Recorder {
            spare: Some(
                history
                    .reader_fd()
                    .map_err(|e| format!("cannot share the history: {e}"))?,
            ),
            history,
            mode,
            max_message_bytes,
            lines: LineLimits::new(mode, max_message_bytes).lines(kept.next_line),
        })
    }

    /// What this process's next image needs to go on with the history:
    /// its memory (kept open across the exec), its records' ages, the
    /// last position and the next line's number.
    pub fn keep_for_next_image(&mut self) -> io::Result<KeptHistory> {
        let fd = self.spare.take().ok_or(io::ErrorKind::AlreadyExists)?;
        wspush::sys::keep_across_exec(fd.as_fd(), true)?;
        let (ages, last) = self.history.writer_state();
        Ok(KeptHistory {
            fd: fd.into_raw_fd(),
            ages_ms: ages.iter().map(|age| age.as_millis() as u64).collect(),
            last,
            next_line: self.lines.next(),
        })
    }

    /// Whether it writes the history in an earlier layout too, for the
    /// processes that read it so (see `SharedHistory::resumed`).
    pub fn has_former(&self) -> bool {
        self.history.has_former()
    }

    /// Stops writing the history's earlier layout: no process reads it.
    pub fn retire_former(&mut self) {
        self.history.retire_former();
    }

    /// A descriptor of the history, for this process's loop to read it by.
    pub fn reader_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.history.reader_fd()
    }

    /// The number the next line of input takes: where an instance started
    /// now begins.
    pub fn next_line(&self) -> u64 {
        self.lines.next()
    }

    /// The history's descriptor, for the instances to inherit.
    pub fn inheritable_fd(&self) -> io::Result<i32> {
        self.history.inheritable_fd()
    }

    /// Numbers the lines of `chunk` (whole lines, control lines too) and
    /// keeps their messages, judged as an instance judges them.
    pub fn record(&mut self, chunk: &[u8]) {
        let (mode, max_message_bytes) = (self.mode, self.max_message_bytes);
        let history = &mut self.history;
        let mut keep = |line: Numbered<'_>| {
            let (number, text, mode) = match line {
                Numbered::Line(number, Line::Text(text))
                | Numbered::Kept(number, Line::Text(text)) => (number, text, mode),
                Numbered::Command(number, Line::Text(text)) => (number, text, InputMode::Commands),
                Numbered::Control(Some(Control::Forget(seq))) => {
                    history.forget_through(seq);
                    return ControlFlow::Continue(());
                }
                Numbered::Control(Some(Control::Gap { from, to })) => {
                    history.mark_missing(from, to);
                    return ControlFlow::Continue(());
                }
                _ => return ControlFlow::<()>::Continue(()),
            };
            if let Ok(Interpreted::Message(to, kind, payload)) = interpret(mode, text) {
                if payload.len() <= max_message_bytes {
                    history.append(number, &to, kind, &payload);
                }
            }
            ControlFlow::Continue(())
        };
        let _ = self.lines.push(chunk, &mut keep);
        let _ = self.lines.finish(&mut keep);
    }

    /// Drops what is older than the history's age bound.
    pub fn evict(&mut self) {
        self.history.evict();
    }
}

/// Carries out what a control line says.
fn carry_out_control(
    handle: &Handle,
    answer_to: &AnswerTo,
    control: Control,
) -> Result<(), ServerGone> {
    match control {
        Control::Ask { id, query } => {
            let answer_to = Arc::clone(answer_to);
            return handle.ask(query, move |answer| answer_to(id, answer));
        }
        Control::FeedLost => handle.feed_lost(),
        Control::FeedRestored(outage) => handle.feed_restored(outage),
        // Their lines are numbered, and taken as commands, by `InputLines`.
        Control::Entry { .. } | Control::Commands { .. } => {}
        Control::Forget(seq) => return handle.advance_to(seq),
        Control::Gap { from, to } => return handle.stream_gap(from, to),
        Control::Lag(lag) => handle.stream_lag(lag),
        Control::Skipped { ms, seq, why } => {
            handle.count_rejected_input();
            log::warn!("stream entry {ms}-{seq} skipped: {}", why.describe());
        }
    }
    Ok(())
}

fn reject(handle: &Handle, number: u64, why: &str) {
    handle.count_rejected_input();
    log::warn!("input line {number} skipped: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_but_a_control_line_takes_the_next_number_skipped_or_not() {
        // A limit shorter than a control line: control lines are still known.
        let mut lines = InputLines::new(4, 4, 7);
        let mut got = Vec::new();
        let input = b"x1\n\xfebad!\n\xfffeed restored 123456789\ntoo long\n\xff?\n\r\n";
        let _ = lines.push(input, |line| {
            got.push(match line {
                Numbered::Control(control) => format!("control {control:?}"),
                Numbered::Line(n, line) => format!("{n} {line:?}"),
                Numbered::Command(n, line) => format!("{n} command {line:?}"),
                Numbered::Kept(n, line) => format!("{n} kept {line:?}"),
            });
            ControlFlow::<()>::Continue(())
        });
        assert_eq!(
            got,
            [
                r#"7 Text("x1")"#,
                "8 TooLong",
                "control Some(FeedRestored(123456.789s))",
                "9 TooLong",
                "control None",
                r#"10 Text("")"#,
            ]
        );
        assert_eq!(lines.next(), 11, "where an instance started now begins");
    }

    #[test]
    fn a_stream_entry_numbers_its_own_lines_and_the_rest_go_on_after_them() {
        let mut lines = InputLines::new(100, 100, 1);
        let mut input = Control::Entry {
            seq: 1000,
            lines: 2,
            keep: true,
        }
        .line();
        input.extend_from_slice(b"a\nb\nstdin\n");
        input.extend(
            Control::Entry {
                seq: 2000,
                lines: 1,
                keep: false,
            }
            .line(),
        );
        input.extend_from_slice(b"c\nd\n");
        let mut got = Vec::new();
        let _ = lines.push(&input, |line| {
            match line {
                Numbered::Control(_) => {}
                Numbered::Line(n, line) => got.push(format!("{n} {line:?}")),
                Numbered::Command(n, line) => got.push(format!("{n} command {line:?}")),
                Numbered::Kept(n, line) => got.push(format!("{n} kept {line:?}")),
            }
            ControlFlow::<()>::Continue(())
        });
        assert_eq!(
            got,
            [
                r#"1000 kept Text("a")"#,
                r#"1001 kept Text("b")"#,
                r#"1002 Text("stdin")"#,
                r#"2000 Text("c")"#,
                r#"2001 Text("d")"#,
            ]
        );
    }
}
