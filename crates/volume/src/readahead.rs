//! Sequential-stream detection for readahead: which blocks to fetch ahead of a read.
//!
//! A volume tracks up to [`STREAMS`] sequential streams at once (a guest reading several
//! files, or fio with several jobs at distant offsets), each in a slot of its own, so that
//! readers that take turns do not end each other's streams. A read that starts where a
//! slot's last read ended (or in that read's last block) continues the slot's stream; from
//! its third read in a row on, a stream asks for the cold blocks among the `window` blocks
//! after each read, in steps of at least half the window (so that blocks written in
//! sequence, back to back in a pack, come in one ranged GET per step).
//!
//! A read that continues no stream takes the least recently used slot that holds no stream
//! yet (fewer than three reads), so that random reads between sequential ones never end a
//! stream, and a stream being born survives up to `STREAMS - 2` of them between its reads;
//! only when every slot holds a stream does it take the least recently used stream's.
//!
//! Contract: a heuristic. Every field is a relaxed atomic and no lock is taken, so that a
//! ublk queue's loop thread can call [`Readahead::note`] on every READ; two callers racing
//! on one slot at worst fetch a window twice or not at all (the fetcher joins fetches
//! already in flight and skips cached blocks).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Sequential streams tracked per volume.
pub(crate) const STREAMS: usize = 8;

/// Reads in a row (the first included) that make a stream.
const STREAK: u32 = 3;

/// One stream's slot.
#[derive(Debug, Default)]
struct Stream {
    /// The block after the last read's end (0 with `streak` 0: a free slot).
    next_block: AtomicU64,
    /// Reads in a row that continued this stream, its first read included.
    streak: AtomicU32,
    /// Blocks below this were handed to the fetcher for this stream (0: none).
    horizon: AtomicU64,
    /// `Readahead::clock` at this slot's last read (0: never used).
    used: AtomicU64,
}

/// The streams of one volume (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Readahead {
    streams: [Stream; STREAMS],
    /// Ticks once per read: the slots' `used` stamps.
    clock: AtomicU64,
}

impl Readahead {
    /// Notes a read of blocks `first..=last` of a volume of `blocks` blocks; returns the
    /// blocks to fetch ahead of it (`window` blocks at most), if any.
    pub(crate) fn note(
        &self,
        first: u64,
        last: u64,
        window: u64,
        blocks: u64,
    ) -> Option<Range<u64>> {
        let now = self.clock.fetch_add(1, Relaxed) + 1;
        let Some(s) = self.continued(first) else {
            let s = self.free_slot();
            s.used.store(now, Relaxed);
            s.next_block.store(last + 1, Relaxed);
            s.streak.store(1, Relaxed);
            s.horizon.store(0, Relaxed);
            return None;
        };
        s.used.store(now, Relaxed);
        s.next_block.fetch_max(last + 1, Relaxed);
        if s.streak.fetch_add(1, Relaxed).saturating_add(1) < STREAK {
            return None;
        }
        let end = (last + 1 + window).min(blocks);
        let start = (last + 1).max(s.horizon.load(Relaxed));
        // The window moves in steps of at least half of it, except at the end of the volume.
        if start >= end || (end - start < (window / 2).max(1) && end < blocks) {
            return None;
        }
        s.horizon.fetch_max(end, Relaxed);
        Some(start..end)
    }

    /// The slot whose stream a read starting at block `first` continues.
    fn continued(&self, first: u64) -> Option<&Stream> {
        self.streams.iter().find(|s| {
            let next = s.next_block.load(Relaxed);
            s.streak.load(Relaxed) > 0 && (first == next || first + 1 == next)
        })
    }

    /// The least recently used slot holding no stream, else the least recently used one.
    fn free_slot(&self) -> &Stream {
        let key = |s: &Stream| (s.streak.load(Relaxed) >= STREAK, s.used.load(Relaxed));
        let mut slots = self.streams.iter();
        let first = slots.next().expect("STREAMS > 0");
        slots.fold(first, |a, b| if key(b) < key(a) { b } else { a })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads of one block each, at `at`, against a 1,000-block volume with a window of 8;
    /// what each asked to fetch.
    fn reads(ra: &Readahead, at: &[u64]) -> Vec<Option<Range<u64>>> {
        at.iter().map(|&b| ra.note(b, b, 8, 1000)).collect()
    }

    #[test]
    fn a_stream_starts_on_its_third_read_and_steps_by_half_a_window() {
        let ra = Readahead::default();
        assert_eq!(
            reads(&ra, &[100, 101, 102, 103, 104, 105, 106]),
            [None, None, Some(103..111), None, None, None, Some(111..115)]
        );
    }

    #[test]
    fn reads_within_the_last_block_continue_the_stream() {
        let ra = Readahead::default();
        assert_eq!(ra.note(0, 0, 8, 1000), None);
        assert_eq!(ra.note(0, 0, 8, 1000), None);
        assert_eq!(ra.note(0, 1, 8, 1000), Some(2..10));
    }

    #[test]
    fn streams_that_take_turns_each_keep_their_slot() {
        let ra = Readahead::default();
        // Four readers, each reading its own region in order, one read each in turn.
        let mut fetched: Vec<Vec<Range<u64>>> = vec![Vec::new(); 4];
        for step in 0..12u64 {
            for (r, got) in fetched.iter_mut().enumerate() {
                let b = r as u64 * 200 + step;
                got.extend(ra.note(b, b, 8, 1000));
            }
        }
        for (r, got) in fetched.iter().enumerate() {
            let base = r as u64 * 200;
            assert_eq!(
                got,
                &[
                    base + 3..base + 11,
                    base + 11..base + 15,
                    base + 15..base + 19
                ],
                "reader {r}"
            );
        }
    }

    #[test]
    fn random_reads_between_do_not_end_a_stream() {
        let ra = Readahead::default();
        let mut got = Vec::new();
        for step in 0..12u64 {
            got.extend(ra.note(step, step, 8, 1000));
            // Random reads after each sequential one: while the stream is being born (its
            // first three reads) as many as leave it its slot, then more than there are slots.
            let randoms = if step < 2 { STREAMS - 2 } else { 3 * STREAMS };
            for j in 0..randoms as u64 {
                let b = 500 + (step * 37 + j * 11) % 400;
                assert_eq!(ra.note(b, b, 8, 1000), None, "random read of block {b}");
            }
        }
        assert_eq!(got, [3..11, 11..15, 15..19]);
    }

    #[test]
    fn when_every_slot_holds_a_stream_a_new_one_takes_them_in_turn() {
        let ra = Readahead::default();
        for r in 0..STREAMS as u64 {
            reads(&ra, &[r * 100, r * 100 + 1, r * 100 + 2]);
        }
        // A ninth stream takes a slot (its first read), and becomes a stream.
        assert_eq!(reads(&ra, &[900, 901, 902]), [None, None, Some(903..911)]);
    }

    #[test]
    fn the_window_stops_at_the_end_of_the_volume() {
        let ra = Readahead::default();
        assert_eq!(
            reads(&ra, &[994, 995, 996, 997, 998, 999]),
            [None, None, Some(997..1000), None, None, None]
        );
    }
}
