//! The JSON feed the bench pads its payloads with and measures DEFLATE
//! on: order-book messages from a fixed seed, so every run sends the same
//! bytes; and the mixer that seeds it.

/// SplitMix64: a well-mixed 64-bit value for each input.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A feed of order-book messages: `levels` price levels per side, prices
/// and sizes moving a little from one message to the next.
pub fn feed(messages: usize, levels: usize) -> Vec<Vec<u8>> {
    let symbols = ["EURUSD", "GBPUSD", "USDJPY", "BTCUSD", "ETHUSD", "XAUUSD"];
    let mut state = 1u64;
    let mut next = move || {
        state = splitmix64(state);
        state
    };
    (0..messages)
        .map(|seq| {
            let symbol = symbols[seq % symbols.len()];
            let mid = 1000.0 + (next() % 100_000) as f64 / 100.0;
            let side = |sign: f64, next: &mut dyn FnMut() -> u64| {
                (0..levels)
                    .map(|i| {
                        let price = mid + sign * (i as f64 + 1.0) * 0.05;
                        format!("[{price:.2},{}]", 1000 + next() % 250_000)
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let bids = side(-1.0, &mut next);
            let asks = side(1.0, &mut next);
            format!(
                "{{\"type\":\"book\",\"symbol\":\"{symbol}\",\"seq\":{seq},\"ts\":\"2026-12-01T12:00:{:02}.{:06}Z\",\"bids\":[{bids}],\"asks\":[{asks}],\"source\":\"feed-a\",\"status\":\"open\"}}",
                seq % 60,
                next() % 1_000_000
            )
            .into_bytes()
        })
        .collect()
}
