//! Payload masking (RFC 6455 §5.3): `byte[i] ^= key[i % 4]`, in place.

/// XORs `buf` with the masking `key`, where `buf[0]` is payload byte number
/// `offset` of its frame. Applying it twice restores the input, so the same
/// function masks and unmasks; a payload can be processed in pieces of any
/// size by passing each piece's offset.
pub fn apply_mask(buf: &mut [u8], key: [u8; 4], offset: u64) {
    let mut key = key;
    key.rotate_left((offset % 4) as usize);
    let word = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(bytes) ^ word).to_ne_bytes());
    }
    // The remainder starts at a multiple of 8 bytes, so the key is in phase.
    for (byte, k) in chunks.into_remainder().iter_mut().zip(key.iter().cycle()) {
        *byte ^= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(buf: &mut [u8], key: [u8; 4], offset: u64) {
        for (i, byte) in buf.iter_mut().enumerate() {
            *byte ^= key[((offset + i as u64) % 4) as usize];
        }
    }

    #[test]
    fn matches_the_rfc_definition_for_every_length_and_offset() {
        let key = [0x37, 0xfa, 0x21, 0x3d];
        let data: Vec<u8> = (0..67u8).collect();
        for len in 0..data.len() {
            for offset in 0..8 {
                let mut fast = data[..len].to_vec();
                let mut slow = fast.clone();
                apply_mask(&mut fast, key, offset);
                naive(&mut slow, key, offset);
                assert_eq!(fast, slow, "len {len} offset {offset}");
            }
        }
    }

    /// The RFC 6455 §5.7 example: a masked "Hello".
    #[test]
    fn unmasks_the_rfc_hello_and_any_split_of_it() {
        let key = [0x37, 0xfa, 0x21, 0x3d];
        let masked = [0x7f, 0x9f, 0x4d, 0x51, 0x58];
        for cut in 0..=masked.len() {
            let mut buf = masked;
            let (a, b) = buf.split_at_mut(cut);
            apply_mask(a, key, 0);
            apply_mask(b, key, cut as u64);
            assert_eq!(&buf, b"Hello", "cut {cut}");
        }
    }
}
