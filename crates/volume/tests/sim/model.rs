//! What the simulation expects every handle to read: page images as tags, and per page the
//! set of tags a page may hold after each kind of failure.
//!
//! A page's bytes carry their own name: the first 8 bytes are the tag of the write that put
//! them there, the next 8 the page index, the rest noise drawn from both. Tag 0 is the zero
//! page (never written, or discarded). So a read names what it returned, and bytes that no
//! write ever produced (a torn page, another volume's block, a stale cache copy of another
//! page) decode to no tag at all.

use std::fmt::Write as _;

pub use crate::common::{BS, PAGE, PAGES};

/// Pages per block.
pub const PPB: usize = BS as usize / PAGE;

/// Pages of an image: a volume may grow to twice its initial size ([`PAGES`]); the pages past
/// a handle's size read as zeros (never written there).
pub const MAX_PAGES: usize = 2 * PAGES;

/// One tag per page.
pub type Img = Vec<u64>;

/// The bytes of page `page` written by the write tagged `tag`.
pub fn page_bytes(tag: u64, page: usize) -> Vec<u8> {
    if tag == 0 {
        return vec![0; PAGE];
    }
    let mut b = glidefs_testkit::noise(
        tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (page as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
        PAGE,
    );
    b[..8].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&(page as u64).to_le_bytes());
    b
}

/// The tag of a page's bytes, or `None` if no write produced them.
pub fn decode(buf: &[u8], page: usize) -> Option<u64> {
    if buf.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let tag = u64::from_le_bytes(buf[..8].try_into().unwrap());
    (page_bytes(tag, page) == buf).then_some(tag)
}

/// Decodes a whole-volume read; `Err` names the first page that decodes to nothing.
pub fn decode_img(buf: &[u8]) -> Result<Img, String> {
    buf.chunks(PAGE)
        .enumerate()
        .map(|(p, chunk)| {
            decode(chunk, p).ok_or_else(|| {
                format!("page {p} (block {}) holds bytes no write produced", p / PPB)
            })
        })
        .collect()
}

/// `img` with `pages` differing from `want` listed, for failure messages.
pub fn diff(img: &[u64], want: &[u64]) -> String {
    let mut out = String::new();
    for (p, (g, w)) in img.iter().zip(want).enumerate() {
        if g != w {
            let _ = write!(out, " p{p}:got#{g},want#{w}");
            if out.len() > 200 {
                out.push_str(" ...");
                break;
            }
        }
    }
    out
}

/// The per-page candidates of a volume: what it reads now, and what a page may read after a
/// crash of its writer or from the store.
#[derive(Debug, Clone)]
pub struct Content {
    /// After every acknowledged write.
    pub cur: Img,
    /// Per page: the content at the last local durability point (a FLUSH, or a flush to the
    /// store), then every write after it. A reopened cache reads one of them.
    pub local: Vec<Vec<u64>>,
    /// Per page: the content of the store's latest publish that is known to have landed, then
    /// the content at every publish whose outcome is unknown since. A fresh host reads one.
    pub store: Vec<Vec<u64>>,
    /// Every image that a publish may have put in the store (oldest first): what a read-only
    /// export may serve.
    pub states: Vec<Img>,
}

impl Content {
    pub fn new(img: Img) -> Self {
        Self {
            local: img.iter().map(|&t| vec![t]).collect(),
            store: img.iter().map(|&t| vec![t]).collect(),
            states: vec![img.clone()],
            cur: img,
        }
    }

    pub fn write(&mut self, first: usize, tags: &[u64]) {
        for (k, &t) in tags.iter().enumerate() {
            self.cur[first + k] = t;
            self.local[first + k].push(t);
        }
    }

    pub fn flushed(&mut self) {
        self.local = self.cur.iter().map(|&t| vec![t]).collect();
    }

    /// A publish of `cur` that landed.
    pub fn published(&mut self) {
        self.flushed();
        self.store = self.cur.iter().map(|&t| vec![t]).collect();
        self.push_state();
    }

    /// A publish of `cur` whose outcome is unknown (it failed; the PUT may have landed).
    pub fn maybe_published(&mut self) {
        for (p, &t) in self.cur.iter().enumerate() {
            if !self.store[p].contains(&t) {
                self.store[p].push(t);
            }
        }
        self.push_state();
    }

    fn push_state(&mut self) {
        if self.states.last() != Some(&self.cur) {
            self.states.push(self.cur.clone());
        }
    }

    /// Checks an image read after a crash of the writer against `local`, and adopts it.
    pub fn after_crash(&mut self, img: Img) -> Result<(), String> {
        check_each(
            &img,
            &self.local,
            "the last local flush or a write after it",
        )?;
        self.cur = img;
        self.flushed();
        Ok(())
    }

    /// Checks an image a new owner read after a takeover against `store`, and adopts it.
    pub fn after_takeover(&mut self, img: Img) -> Result<(), String> {
        check_each(&img, &self.store, "a publish that may have landed")?;
        if !self.states.contains(&img) {
            let near = self
                .states
                .iter()
                .enumerate()
                .map(|(i, s)| (s.iter().zip(&img).filter(|(a, b)| a != b).count(), i))
                .min()
                .unwrap();
            return Err(format!(
                "the new owner reads a state that was never published ({} published states; \
                 nearest is #{} of them:{}; the acknowledged image:{})",
                self.states.len(),
                near.1,
                diff(&img, &self.states[near.1]),
                diff(&img, &self.cur)
            ));
        }
        self.cur = img;
        self.published();
        Ok(())
    }

    /// Checks a read-only export's image: an export of a live volume is not a point-in-time
    /// image (`follow.rs`): each block reads whole as in one published state, and no block
    /// older than what the export served before; `floor` is the oldest state (an index into
    /// `states`) it may still serve. Returns the next floor: the newest of the oldest states
    /// each block can have come from (the export served at least that one by the end).
    pub fn check_export(&self, img: &[u64], floor: usize) -> Result<usize, String> {
        let mut next = floor;
        for (b, got) in img.chunks(PPB).enumerate() {
            let pages = b * PPB..(b * PPB + got.len());
            let from = (floor..self.states.len()).find(|&i| &self.states[i][pages.clone()] == got);
            match from {
                Some(i) => next = next.max(i),
                None => {
                    let last = self.states.last().unwrap();
                    return Err(format!(
                        "block {b} as in no published state since the one it served before \
                         ({} published states, {floor} older; against the latest:{})",
                        self.states.len(),
                        diff(img, last)
                    ));
                }
            }
        }
        Ok(next)
    }

    pub fn check_cur(&self, img: &Img) -> Result<(), String> {
        if img == &self.cur {
            return Ok(());
        }
        Err(format!(
            "differs from every acknowledged write:{}",
            diff(img, &self.cur)
        ))
    }
}

fn check_each(img: &[u64], allowed: &[Vec<u64>], what: &str) -> Result<(), String> {
    for (p, (g, ok)) in img.iter().zip(allowed).enumerate() {
        if !ok.contains(g) {
            return Err(format!(
                "page {p} reads #{g}, which is not {what} (allowed {ok:?})"
            ));
        }
    }
    Ok(())
}
