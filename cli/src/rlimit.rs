//! The open-file limit: how many connections one process can hold, and
//! how many instances a number of connections needs.

/// Descriptors a server keeps for itself (listener, epoll, waker, stdio,
/// the binary and libraries) before any connection.
pub const RESERVED_FDS: u64 = 32;

/// Connections that fit in `open_files` descriptors.
pub fn connection_capacity(open_files: u64) -> u64 {
    open_files.saturating_sub(RESERVED_FDS)
}

/// Share of its capacity, in %, an instance is planned to fill when
/// instances are counted for a number of connections: the kernel spreads
/// connections over `SO_REUSEPORT` listeners by hash, so some instances get
/// more than their share (about 2% more at a million over 60).
pub const INSTANCE_FILL_PERCENT: u64 = 90;

/// Instances for `total` connections when each can hold `per_instance`
/// (planned at [`INSTANCE_FILL_PERCENT`] of it), and never fewer than
/// `cores`: one single-threaded instance per core uses the machine, and
/// more are needed where one process may not hold enough descriptors
/// (a million connections at 20,000 files per process: 56 instances).
pub fn instances_for(total: Option<u64>, per_instance: u64, cores: usize) -> usize {
    let planned = (per_instance.saturating_mul(INSTANCE_FILL_PERCENT) / 100).max(1);
    let needed = total.map_or(0, |total| total.div_ceil(planned));
    usize::try_from(needed)
        .unwrap_or(usize::MAX)
        .max(cores)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_descriptors_come_off_the_limit() {
        assert_eq!(connection_capacity(20_000), 19_968);
        assert_eq!(connection_capacity(10), 0);
    }

    #[test]
    fn instances_cover_the_total_at_90_percent_and_at_least_every_core() {
        let per_instance = connection_capacity(20_000);
        // 19,968 per instance, planned at 17,971.
        assert_eq!(instances_for(Some(1_000_000), per_instance, 2), 56);
        assert_eq!(instances_for(Some(17_971), per_instance, 1), 1);
        assert_eq!(instances_for(Some(17_972), per_instance, 1), 2);
        // No total, or a small one: one per core.
        assert_eq!(instances_for(None, per_instance, 8), 8);
        assert_eq!(instances_for(Some(100), per_instance, 8), 8);
        assert_eq!(instances_for(None, per_instance, 0), 1);
        // An unlimited open-file limit, or a tiny --max-connections.
        assert_eq!(instances_for(Some(1_000_000), u64::MAX, 2), 2);
        assert_eq!(instances_for(Some(50), 10, 2), 6);
        assert_eq!(instances_for(Some(5), 1, 2), 5);
    }
}
