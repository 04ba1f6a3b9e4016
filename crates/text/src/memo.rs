//! The ids of recently encoded long texts, so that a text that starts like one of them encodes
//! only what follows the shared beginning.
//!
//! A served conversation comes back whole with every turn, and an agent's requests repeat a
//! long system prompt: encoding all of it again costs about a millisecond per thousand tokens,
//! paid before the prefix cache can skip the same tokens' prefill. Where the tokenizer's exact
//! cuts are known (`crate::pieces`), a text is encoded in pieces between exact cuts and each
//! cut's id count is kept beside the ids. A new text that shares the bytes up to and past one
//! of those cuts, and for which that place is an exact cut too (the test looks at the bytes on
//! both sides of it, all shared), has the same ids up to it: the pieces before it are the
//! same bytes, encoded the same way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::pieces;

/// Texts shorter than this are encoded without the memo (it would save microseconds).
pub(crate) const MIN_BYTES: usize = 2 << 10;

/// The bytes after which a recorded piece ends at the next exact cut: where a later text may
/// resume. Smaller pieces resume closer to the end of the shared bytes but cost a call each.
pub(crate) const STEP_BYTES: usize = 1 << 10;

/// The most texts kept, and the most bytes of text (and four per id) kept in all.
const MAX_ENTRIES: usize = 16;
const MAX_BYTES: usize = 64 << 20;

/// One encoded text: its ids and, per recorded cut, (byte offset, ids before it).
struct Entry {
    allow_special: bool,
    text: String,
    ids: Vec<u32>,
    cuts: Vec<(usize, usize)>,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.text.len() + 4 * self.ids.len() + 16 * self.cuts.len()
    }
}

/// Recently encoded texts, most recent last.
#[derive(Default)]
pub(crate) struct Memo {
    entries: Mutex<Vec<Entry>>,
    /// Bytes of text whose ids came from the memo, over this memo's life.
    skipped: AtomicUsize,
}

/// Where encoding `text` may start: byte `at`, after `ids`; `cuts` are the recorded cuts up to
/// and including `at` (for the new text's own entry).
pub(crate) struct Resume {
    pub at: usize,
    pub ids: Vec<u32>,
    pub cuts: Vec<(usize, usize)>,
}

impl Memo {
    /// The longest beginning of `text` whose ids a kept text gives: the last of its recorded
    /// cuts before the bytes the two texts share end, that is an exact cut of `text` too.
    pub(crate) fn resume(&self, text: &str, allow_special: bool) -> Option<Resume> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (best, shared) = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.allow_special == allow_special)
            .map(|(n, e)| (n, shared_len(&e.text, text)))
            .max_by_key(|&(_, shared)| shared)?;
        let entry = &entries[best];
        // A cut at p needs the byte at p (and the char starting there) shared as well.
        let (at, count) = entry
            .cuts
            .iter()
            .rev()
            .find(|&&(p, _)| p < shared && pieces::is_cut(text, p) && text.is_char_boundary(p))
            .copied()?;
        let resume = Resume {
            at,
            ids: entry.ids[..count].to_vec(),
            cuts: entry
                .cuts
                .iter()
                .copied()
                .take_while(|&(p, _)| p <= at)
                .collect(),
        };
        // Most recently used last.
        let entry = entries.remove(best);
        entries.push(entry);
        self.skipped.fetch_add(at, Ordering::Relaxed);
        Some(resume)
    }

    /// Bytes of text whose ids came from the memo so far.
    pub(crate) fn skipped_bytes(&self) -> usize {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Keeps `text`'s encoding, dropping the least recently used texts beyond the bounds.
    pub(crate) fn keep(
        &self,
        text: &str,
        allow_special: bool,
        ids: Vec<u32>,
        cuts: Vec<(usize, usize)>,
    ) {
        let entry = Entry {
            allow_special,
            text: text.to_owned(),
            ids,
            cuts,
        };
        if entry.bytes() > MAX_BYTES {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|e| e.allow_special != allow_special || e.text != text);
        entries.push(entry);
        let mut total: usize = entries.iter().map(Entry::bytes).sum();
        while entries.len() > MAX_ENTRIES || total > MAX_BYTES {
            total -= entries.remove(0).bytes();
        }
    }
}

/// The number of leading bytes `a` and `b` share.
fn shared_len(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len().min(b.len());
    // Compare in blocks first: long shared prefixes are the case this is for.
    let mut i = 0;
    while i + 64 <= n && a[i..i + 64] == b[i..i + 64] {
        i += 64;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_len_counts_common_leading_bytes() {
        assert_eq!(shared_len("", "abc"), 0);
        assert_eq!(shared_len("abc", "abd"), 2);
        let long = "x".repeat(200);
        assert_eq!(shared_len(&long, &long), 200);
        assert_eq!(shared_len(&long, &format!("{}y", &long[..130])), 130);
    }

    #[test]
    fn the_memo_keeps_the_most_recent_texts_within_bounds() {
        let memo = Memo::default();
        for n in 0..MAX_ENTRIES + 5 {
            memo.keep(&format!("text {n}"), true, vec![n as u32], vec![(0, 0)]);
        }
        let entries = memo.entries.lock().unwrap();
        assert_eq!(entries.len(), MAX_ENTRIES);
        assert_eq!(
            entries.last().unwrap().text,
            format!("text {}", MAX_ENTRIES + 4)
        );
        assert_eq!(entries[0].text, "text 5");
    }
}
