//! The send buffer: client frames are written into initialised memory in
//! one pass (header, then the payload masked while it is copied) and the
//! shell writes straight out of it.

use super::close::{CloseCode, MAX_CLOSE_REASON};
use super::frame::{MAX_CONTROL_PAYLOAD, MAX_HEADER_LEN, Opcode};
use super::mask::copy_masked;

/// Pending outgoing bytes: `buf[start..end]`; `buf.len()` is initialised
/// room that is reused, so steady-state sends neither allocate nor clear.
#[derive(Default)]
pub(crate) struct TxBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl TxBuf {
    /// Bytes waiting to be written.
    #[inline]
    pub(crate) fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    /// `n` bytes were written to the socket.
    #[inline]
    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n.min(self.len());
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Appends raw bytes (the handshake request).
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.room(bytes.len()).copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Makes `n` bytes of room after `end` and returns them.
    #[inline]
    fn room(&mut self, n: usize) -> &mut [u8] {
        if self.end + n > self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end + n > self.buf.len() {
                let grown = (self.end + n).max(self.buf.len() * 2);
                self.buf.resize(grown, 0);
            }
        }
        &mut self.buf[self.end..self.end + n]
    }

    /// Appends one masked, unfragmented client frame.
    #[inline]
    pub(crate) fn write_frame(&mut self, opcode: Opcode, payload: &[u8], mask: [u8; 4]) {
        let len = payload.len();
        let mut hdr = [0u8; MAX_HEADER_LEN];
        hdr[0] = 0x80 | opcode.as_u8();
        let hl = if len < 126 {
            // The 7-bit form is minimal below 126.
            hdr[1] = 0x80 | len as u8;
            2
        } else if let Ok(len16) = u16::try_from(len) {
            hdr[1] = 0x80 | 126;
            hdr[2..4].copy_from_slice(&len16.to_be_bytes());
            4
        } else {
            hdr[1] = 0x80 | 127;
            hdr[2..10].copy_from_slice(&(len as u64).to_be_bytes());
            10
        };
        hdr[hl..hl + 4].copy_from_slice(&mask);
        let total = hl + 4 + len;
        let room = self.room(total);
        room[..hl + 4].copy_from_slice(&hdr[..hl + 4]);
        copy_masked(&mut room[hl + 4..], payload, mask);
        self.end += total;
    }

    /// Appends a close frame: the code and `reason` (the caller bounds it
    /// by 123 bytes), or an empty payload.
    pub(crate) fn write_close(&mut self, code: Option<CloseCode>, reason: &str, mask: [u8; 4]) {
        match code {
            Some(c) => {
                let mut payload = [0u8; MAX_CONTROL_PAYLOAD];
                payload[..2].copy_from_slice(&c.as_u16().to_be_bytes());
                let n = reason.len().min(MAX_CLOSE_REASON);
                payload[2..2 + n].copy_from_slice(&reason.as_bytes()[..n]);
                self.write_frame(Opcode::Close, &payload[..2 + n], mask);
            }
            None => self.write_frame(Opcode::Close, &[], mask),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the 7-bit/16-bit boundary: the minimal header,
    /// the key, and the payload masked (RFC 6455 §5.2, §5.3).
    #[test]
    fn frames_use_the_minimal_header_and_mask_every_byte() {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        for len in 0..=300usize {
            let payload: Vec<u8> = (0..len).map(|i| (i * 13 + 7) as u8).collect();
            let mut tx = TxBuf::default();
            tx.push(b"x");
            tx.write_frame(Opcode::Binary, &payload, mask);
            let out = &tx.pending()[1..];
            assert_eq!(out[0], 0x82, "len {len}");
            let (hl, encoded) = if len < 126 {
                (2, usize::from(out[1] & 0x7f))
            } else {
                assert_eq!(out[1] & 0x7f, 126, "len {len}");
                (4, usize::from(u16::from_be_bytes([out[2], out[3]])))
            };
            assert_eq!(out[1] & 0x80, 0x80, "mask bit, len {len}");
            assert_eq!(encoded, len);
            assert_eq!(&out[hl..hl + 4], &mask);
            let body: Vec<u8> = out[hl + 4..]
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ mask[i % 4])
                .collect();
            assert_eq!(body, payload, "len {len}");
        }
    }
}
