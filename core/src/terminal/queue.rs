//! The unread-output queue: bounded by bytes and by chunks (features C7.3).

use std::collections::VecDeque;

/// Most unread chunks held for the consumer.
pub const MAX_UNREAD_CHUNKS: usize = 1_024;

/// Output chunks waiting for the consumer, stored back to back in one
/// buffer (no allocation per chunk once the buffer has grown).
pub(crate) struct OutputQueue {
    data: Vec<u8>,
    read: usize,
    lens: VecDeque<usize>,
    max_bytes: usize,
}

/// Why a chunk was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overflow {
    /// More than `max_bytes` would be unread (the total it would reach).
    Bytes(u64),
    /// More than [`MAX_UNREAD_CHUNKS`] would be unread.
    Chunks,
}

impl OutputQueue {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            data: Vec::new(),
            read: 0,
            lens: VecDeque::new(),
            max_bytes,
        }
    }

    /// Unread bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() - self.read
    }

    /// The byte cap.
    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Unread chunks.
    pub(crate) fn chunks(&self) -> usize {
        self.lens.len()
    }

    /// Appends a chunk, or refuses it and changes nothing.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<(), Overflow> {
        if self.lens.len() >= MAX_UNREAD_CHUNKS {
            return Err(Overflow::Chunks);
        }
        let total = self.bytes() + chunk.len();
        if total > self.max_bytes {
            return Err(Overflow::Bytes(total as u64));
        }
        if self.read == self.data.len() {
            self.data.clear();
            self.read = 0;
        } else if self.read > 0 && self.data.len() + chunk.len() > self.data.capacity() {
            // Compact instead of growing: the live part is ≤ max_bytes.
            self.data.drain(..self.read);
            self.read = 0;
        }
        self.data.extend_from_slice(chunk);
        self.lens.push_back(chunk.len());
        Ok(())
    }

    /// Removes the oldest chunk and lends it until the next mutation.
    pub(crate) fn pop(&mut self) -> Option<&[u8]> {
        let len = self.lens.pop_front()?;
        let start = self.read;
        self.read += len;
        self.data.get(start..self.read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cap_at_n_and_n_plus_one() {
        let mut q = OutputQueue::new(1_024);
        assert_eq!(q.push(&[1; 1_000]), Ok(()));
        assert_eq!(q.push(&[2; 24]), Ok(()));
        assert_eq!(q.push(&[3; 1]), Err(Overflow::Bytes(1_025)));
        assert_eq!((q.bytes(), q.chunks()), (1_024, 2));
        assert_eq!(q.pop(), Some(&[1u8; 1_000][..]));
        assert_eq!(q.push(&[3; 1_000]), Ok(()));
        assert_eq!(q.pop(), Some(&[2u8; 24][..]));
        assert_eq!(q.pop(), Some(&[3u8; 1_000][..]));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn chunk_cap_at_n_and_n_plus_one() {
        let mut q = OutputQueue::new(1_048_576);
        for _ in 0..MAX_UNREAD_CHUNKS {
            assert_eq!(q.push(b"x"), Ok(()));
        }
        assert_eq!(q.push(b"x"), Err(Overflow::Chunks));
        assert!(q.pop().is_some());
        assert_eq!(q.push(b"y"), Ok(()));
    }
}
