//! Pure helpers: the lines written to a server, the `id` mode's choice of
//! targets, and which connections opened.

use crate::wire::feed::splitmix64;
use crate::wire::message::{self, Stamp};

/// `prefix` followed by the payload of `stamp` (`size` bytes) and `\n`.
pub fn line(prefix: &str, stamp: Stamp, size: usize) -> Vec<u8> {
    let payload = message::encode(stamp, size).expect("payload size checked up front");
    let mut out = Vec::with_capacity(prefix.len() + size + 1);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(&payload);
    out.push(b'\n');
    out
}

/// The target of message `seq` among `count` candidates, for `seed`.
pub fn target(seed: u64, seq: u32, count: usize) -> usize {
    (splitmix64(seed.wrapping_mul(0x1_0000_0001) ^ u64::from(seq)) % count.max(1) as u64) as usize
}

/// Whether each of `conns` connections opened, given those that failed.
pub(super) fn open_mask(conns: u64, failed: &[u64]) -> Vec<bool> {
    let mut open = vec![true; conns as usize];
    for &f in failed {
        if let Some(o) = open.get_mut(f as usize) {
            *o = false;
        }
    }
    open
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn lines_carry_their_stamp_after_the_command() {
        let stamp = Stamp {
            seq: 17,
            sent_ns: 123_456_789,
        };
        let l = line("pub hot ", stamp, 32);
        assert_eq!(l.len(), "pub hot ".len() + 32 + 1);
        let text = std::str::from_utf8(&l).unwrap();
        assert!(text.starts_with("pub hot 17 123456789 ."), "{text}");
        assert!(text.ends_with(".\n"));
        let payload = &l["pub hot ".len()..l.len() - 1];
        assert_eq!(message::decode(payload, 32), Some(stamp));
        assert_eq!(line("", stamp, 32).len(), 33);
    }

    #[test]
    fn targets_are_spread_and_repeatable() {
        let n = 19_000;
        let picks: Vec<usize> = (1..=10_000).map(|s| target(1, s, n)).collect();
        assert!(picks.iter().all(|&p| p < n));
        assert_eq!(
            picks,
            (1..=10_000).map(|s| target(1, s, n)).collect::<Vec<_>>()
        );
        let distinct: BTreeSet<usize> = picks.iter().copied().collect();
        // 10,000 draws among 19,000: about 7,700 distinct.
        assert!(distinct.len() > 7_000, "{}", distinct.len());
        assert_ne!(
            picks[..10],
            (1..=10).map(|s| target(2, s, n)).collect::<Vec<_>>()[..]
        );
        assert_eq!(target(1, 5, 1), 0);
    }

    #[test]
    fn open_masks_leave_out_the_failed() {
        assert_eq!(open_mask(4, &[1, 3, 9]), vec![true, false, true, false]);
    }
}
