//! The supervisor's state as it re-executes itself (SIGUSR2 with a binary
//! that reads it): what its next image needs to go on with the same
//! instances, processes, history and input. JSON with a format number,
//! in a memory file; every descriptor it names is kept open across the
//! exec. Pure: values in, bytes out, and back; beside it, how a run of
//! the supervisor ends ([`RunEnd`]).

use serde::{Deserialize, Serialize};

use crate::input::KeptHistory;
use crate::sources::stop::Carried;

/// The format this build writes and reads.
pub const FORMAT: u16 = 1;

/// The supervisor's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// [`FORMAT`].
    pub format: u16,
    /// The address every instance listens on (a port 0 resolved).
    pub listen: String,
    /// The socket holding that port, if one does.
    pub port_hold: Option<i32>,
    /// The history, and the input's numbering.
    pub history: KeptHistory,
    /// The host's shared words.
    pub host: i32,
    /// The host's metrics board (none from a build before it had one: a
    /// new board is made).
    #[serde(default)]
    pub metrics: Option<i32>,
    /// What the sources left it.
    pub carried: Carried,
    /// Instances started again so far, in all.
    pub restarts: u64,
    /// Feeds lost now.
    pub feeds_lost: usize,
    /// The instances, in order (the first is instance 1).
    pub instances: Vec<InstanceImage>,
    /// The processes alive.
    pub procs: Vec<ProcImage>,
}

/// One instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceImage {
    /// Its listener.
    pub listener: i32,
    /// Its process's key, if one runs.
    pub running: Option<usize>,
    /// How long until it starts again (ms), if it waits to (neither:
    /// gone).
    pub waiting_ms: Option<u64>,
    /// Young deaths in a row.
    pub young_deaths: u32,
    /// Times started again.
    pub restarts: u64,
    /// Processes started for it so far.
    pub processes: u64,
}

/// One process, serving its instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcImage {
    /// Its key (its pipes' tokens are made from it).
    pub key: usize,
    /// The instance it serves.
    pub number: usize,
    /// Its pid.
    pub pid: u32,
    /// Its input pipe, until the input ends.
    pub input: Option<i32>,
    /// The input queued for it and not written yet.
    pub backlog: Vec<u8>,
    /// How long it has run (ms).
    pub age_ms: u64,
    /// Its status pipe.
    pub status: Option<i32>,
    /// The bytes of a record heard in part on it.
    pub heard: Vec<u8>,
    /// It said it listens.
    pub listening: bool,
    /// Its slot on the metrics board, if it has one.
    #[serde(default)]
    pub metrics_slot: Option<usize>,
    /// It said it is full.
    pub full: bool,
    /// The supervisor's end of its control socket.
    pub control: i32,
    /// Its output pipe (with upstream lines).
    pub output: Option<i32>,
    /// What was read there of a line it did not finish.
    pub output_unfinished: Vec<u8>,
}

/// A re-exec asked for: the binary checked, standard input asked to stop.
#[derive(Debug)]
pub struct Pending {
    /// The binary, open (what runs is what was checked).
    pub binary: std::fs::File,
}

/// How [`Supervisor::run`] ended.
#[derive(Debug)]
pub enum RunEnd {
    /// Every instance exited.
    Stopped,
    /// The supervisor stopped for its next image: its state (every
    /// descriptor it names kept open across an exec), and the binary.
    ReExec(Box<Image>, std::fs::File),
}

impl Image {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an image is plain data")
    }

    /// The image in `bytes`; one of another format (or none) is an error
    /// naming why.
    pub fn decode(bytes: &[u8]) -> Result<Image, String> {
        #[derive(Deserialize)]
        struct Format {
            format: u16,
        }
        let format: Format =
            serde_json::from_slice(bytes).map_err(|e| format!("not a supervisor's state: {e}"))?;
        if format.format != FORMAT {
            return Err(format!(
                "a state of format {} (this build reads {FORMAT})",
                format.format
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| format!("a malformed supervisor's state: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Image {
        Image {
            format: FORMAT,
            listen: "127.0.0.1:8080".into(),
            port_hold: None,
            history: KeptHistory {
                fd: 5,
                ages_ms: vec![3, 1],
                last: 41,
                next_line: 42,
            },
            host: 6,
            metrics: Some(13),
            carried: Carried {
                unfinished: b"half a li".to_vec(),
                publish_listener: Some(12),
                stream_at: None,
                history: None,
            },
            restarts: 2,
            feeds_lost: 0,
            instances: vec![InstanceImage {
                listener: 7,
                running: Some(0),
                waiting_ms: None,
                young_deaths: 0,
                restarts: 1,
                processes: 2,
            }],
            procs: vec![ProcImage {
                key: 0,
                number: 1,
                pid: 4242,
                input: Some(8),
                backlog: b"line 40\n".to_vec(),
                age_ms: 1_000,
                status: Some(9),
                heard: vec![],
                listening: true,
                metrics_slot: Some(0),
                full: false,
                control: 10,
                output: Some(11),
                output_unfinished: b"msg 0.1".to_vec(),
            }],
        }
    }

    #[test]
    fn an_image_reads_back_the_same() {
        let image = image();
        assert_eq!(Image::decode(&image.encode()), Ok(image.clone()));
    }

    #[test]
    fn an_image_of_a_build_before_the_metrics_board_reads_with_none() {
        let mut earlier: serde_json::Value = serde_json::from_slice(&image().encode()).unwrap();
        earlier.as_object_mut().unwrap().remove("metrics");
        earlier["procs"][0]
            .as_object_mut()
            .unwrap()
            .remove("metrics_slot");
        let read = Image::decode(&serde_json::to_vec(&earlier).unwrap()).unwrap();
        assert_eq!((read.metrics, read.procs[0].metrics_slot), (None, None));
    }

    #[test]
    fn another_format_or_no_state_is_refused_with_why() {
        let mut other = image();
        other.format = FORMAT + 1;
        let e = Image::decode(&other.encode()).unwrap_err();
        assert!(e.contains(&format!("format {}", FORMAT + 1)), "{e}");
        assert!(Image::decode(b"{}").is_err());
        assert!(Image::decode(b"not json")
            .unwrap_err()
            .contains("not a supervisor's state"));
    }
}
