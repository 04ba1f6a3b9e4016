//! A batched step's bookkeeping: which of the step's concatenated token rows belong to which
//! sequence, and what happens when one sequence fails (its rows leave the step, the others go on
//! unchanged).
//!
//! The flow keeps every sequence's new tokens as one block of rows `[N, width]`, sequence after
//! sequence, so token-wise work (norms, projections, experts, the LM head) runs once over all of
//! them; per-sequence work runs on a [`Span`] of those rows with that sequence's own state.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::{first_non_finite_row, EngineError, NonFiniteSite, Result};
use crate::paged::KvPool;
use crate::session::Session;
use crate::BatchItem;
use spindle_model::forward::LogitsFor;
use spindle_model::mrope::{ImageFeatures, TokenRole};

/// Where a sequence's new tokens sit in the step's rows, and its first new position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// Row range in the step's `[N, ·]` blocks.
    pub rows: Range<usize>,
    /// Absolute position (cache index) of the first of those rows.
    pub start: usize,
    /// The rotary positions of the rows.
    pub rope: RopeSpan,
}

/// The rotary positions of a span's rows (shared docs `VISION.md` §4.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RopeSpan {
    /// Text only: row t rotates by position `first + t` (the cache index, plus rope_delta
    /// after an image).
    Text(usize),
    /// Rows holding image tokens: each row's (T, H, W) position.
    Mrope(Vec<[usize; 3]>),
}

/// One image row that replaces a token's embedding: row `token` of the sequence's new tokens
/// takes row `row` of `features`.
#[derive(Clone, Debug)]
pub struct ImageRow {
    pub token: usize,
    pub features: Arc<ImageFeatures>,
    pub row: usize,
}

/// Places `ids` on `session`'s rotary positions and pending images (advancing its cursor):
/// the span's positions and the rows whose embeddings image features replace. Text-only
/// sessions take the fast path (no allocation). `image_token` is `None` for a model without
/// image input.
fn place(
    session: &mut Session,
    ids: &[u32],
    image_token: Option<u32>,
) -> Result<(RopeSpan, Vec<ImageRow>)> {
    let position = session.position;
    let cursor = &mut session.rope;
    match image_token {
        Some(image_token) if !cursor.is_text_only() => {
            let images: Vec<Arc<ImageFeatures>> =
                cursor.pending.iter().map(|p| p.features.clone()).collect();
            let (roles, positions) = cursor.place(ids, position, image_token)?;
            let rows = roles
                .iter()
                .enumerate()
                .filter_map(|(token, role)| match *role {
                    TokenRole::Image { image, row } => Some(ImageRow {
                        token,
                        features: images[image].clone(),
                        row,
                    }),
                    TokenRole::Text => None,
                })
                .collect();
            Ok((RopeSpan::Mrope(positions), rows))
        }
        _ => Ok((RopeSpan::Text(cursor.text_position(position)), Vec::new())),
    }
}

impl Span {
    pub fn tokens(&self) -> usize {
        self.rows.len()
    }
}

/// One sequence of a step: its session, its new tokens and where they sit.
pub struct Seq<'s> {
    /// Index of the caller's item (its result slot).
    pub item: usize,
    pub session: &'s mut Session,
    pub ids: &'s [u32],
    pub want: LogitsFor,
    /// The session's position when the step began (errors count tokens from it).
    pub origin: usize,
    pub span: Span,
    /// Rows whose embeddings image features replace.
    pub images: Vec<ImageRow>,
}

/// The sequences still running in a step, and the results of those that finished or failed.
pub struct Step<'s> {
    pub seqs: Vec<Seq<'s>>,
    results: Vec<Option<Result<Vec<f32>>>>,
}

impl<'s> Step<'s> {
    /// Lays the items' tokens out one after another. A session broken by an earlier step gets
    /// its [`EngineError::BrokenSession`] at once and takes no rows.
    pub fn new(items: &'s mut [BatchItem<'_>]) -> Self {
        Self::with_images(items, None)
    }

    /// [`Step::new`] for a model with image input: each sequence's tokens are placed on its
    /// pending images (`image_token` pads take image rows, 3-D positions). A sequence whose
    /// tokens do not fit its images (text inside an image's pads) gets its error and takes no
    /// rows; its session is unchanged.
    pub fn with_images(items: &'s mut [BatchItem<'_>], image_token: Option<u32>) -> Self {
        Self::build(items, image_token, None)
    }

    /// [`Step::with_images`] for sessions whose keys and values live in `pool`: each running
    /// sequence's block table is made ready for its new tokens first (new blocks, a private copy
    /// of a shared block it would write into). A sequence the pool has no blocks for gets
    /// [`EngineError::KvPoolFull`], one whose session belongs to another pool its error; either
    /// takes no rows and its session is unchanged.
    pub fn with_pool(
        items: &'s mut [BatchItem<'_>],
        image_token: Option<u32>,
        pool: &Arc<KvPool>,
    ) -> Self {
        Self::build(items, image_token, Some(pool))
    }

    fn build(
        items: &'s mut [BatchItem<'_>],
        image_token: Option<u32>,
        pool: Option<&Arc<KvPool>>,
    ) -> Self {
        let mut results: Vec<Option<Result<Vec<f32>>>> = (0..items.len()).map(|_| None).collect();
        let mut seqs = Vec::with_capacity(items.len());
        let mut next_row = 0;
        for (item, it) in items.iter_mut().enumerate() {
            if let Some(cause) = &it.session.broken {
                results[item] = Some(Err(EngineError::BrokenSession {
                    cause: cause.clone(),
                }));
                continue;
            }
            let start = it.session.position;
            if let Some(pool) = pool {
                if !Arc::ptr_eq(it.session.kv.pool(), pool) {
                    results[item] = Some(Err(EngineError::ForeignSession));
                    continue;
                }
                if let Err(e) = it.session.kv.prepare_write(start, start + it.ids.len()) {
                    results[item] = Some(Err(e.into()));
                    continue;
                }
            }
            let (rope, images) = match place(it.session, it.ids, image_token) {
                Ok(placed) => placed,
                Err(e) => {
                    results[item] = Some(Err(e));
                    continue;
                }
            };
            let rows = next_row..next_row + it.ids.len();
            next_row = rows.end;
            seqs.push(Seq {
                item,
                session: &mut *it.session,
                ids: it.ids,
                want: it.want,
                origin: start,
                span: Span { rows, start, rope },
                images,
            });
        }
        Step { seqs, results }
    }

    /// Rows in the step (all running sequences' new tokens).
    pub fn tokens(&self) -> usize {
        self.seqs.last().map_or(0, |s| s.span.rows.end)
    }

    /// Rows per running sequence, in row order (how the token-wise kernels group rows).
    pub fn groups(&self) -> Vec<usize> {
        self.seqs.iter().map(|s| s.span.tokens()).collect()
    }

    /// The running sequences' spans, in row order.
    pub fn spans(&self) -> Vec<Span> {
        self.seqs.iter().map(|s| s.span.clone()).collect()
    }

    /// Every running sequence's tokens, in row order.
    pub fn ids(&self) -> Vec<u32> {
        self.seqs
            .iter()
            .flat_map(|s| s.ids.iter().copied())
            .collect()
    }

    /// Ends sequence `k` with `error`: its session is marked broken (its state is part-way
    /// through the step). Rows are not touched: call [`Step::compact`] after.
    fn fail(&mut self, k: usize, error: EngineError) {
        let seq = &mut self.seqs[k];
        seq.session.broken = Some(error.to_string());
        self.results[seq.item] = Some(Err(error));
    }

    /// Fails every running sequence with the error `make` builds (a failure that is not local
    /// to any sequence's rows, such as a streamed expert that could not be read).
    pub fn fail_all(&mut self, make: impl Fn() -> EngineError) {
        for k in 0..self.seqs.len() {
            self.fail(k, make());
        }
        self.seqs.clear();
    }

    /// Checks rows `x` (`[N, width]`, every running sequence's rows: the residual stream
    /// after a sublayer, the head input, the logits): a sequence whose rows hold a NaN or an
    /// infinity fails with `site` and its rows leave `x`, so the others' rows (and results)
    /// are exactly what they would be without it.
    pub fn check_rows(&mut self, x: &mut Vec<f32>, width: usize, site: NonFiniteSite) {
        // One vectorized pass over everything first: the usual case has nothing to find.
        if first_non_finite_row(x, width).is_none() {
            return;
        }
        let mut failed = Vec::new();
        for (k, seq) in self.seqs.iter().enumerate() {
            let rows = &seq.span.rows;
            if let Some(row) = first_non_finite_row(&x[rows.start * width..rows.end * width], width)
            {
                let position = seq.span.start + row;
                failed.push((
                    k,
                    EngineError::NonFinite {
                        site,
                        token: position - seq.origin,
                        position,
                    },
                ));
            }
        }
        for (k, error) in failed {
            self.fail(k, error);
        }
        self.compact(x, width);
    }

    /// Keeps only the rows each sequence wants logits for (its last row, or all of them) in
    /// `h`, and narrows the spans to them.
    pub fn keep_wanted_rows(&mut self, h: &mut Vec<f32>, width: usize) {
        if self.seqs.iter().all(|s| s.want == LogitsFor::All) {
            return;
        }
        let mut kept = Vec::with_capacity(self.seqs.len() * width);
        let mut next_row = 0;
        for seq in &mut self.seqs {
            let rows = seq.span.rows.clone();
            let first = match seq.want {
                LogitsFor::All => rows.start,
                LogitsFor::Last => rows.end - 1,
            };
            kept.extend_from_slice(&h[first * width..rows.end * width]);
            seq.span.start += first - rows.start;
            seq.span.rows = next_row..next_row + (rows.end - first);
            next_row = seq.span.rows.end;
        }
        *h = kept;
    }

    /// Each running sequence's rows of `x` (`[N, width]`) become its result.
    pub fn finish_all(&mut self, x: &[f32], width: usize) {
        for seq in self.seqs.drain(..) {
            let rows = &seq.span.rows;
            self.results[seq.item] = Some(Ok(x[rows.start * width..rows.end * width].to_vec()));
        }
    }

    /// Drops the rows of sequences that have a result (failed ones) from `h` and renumbers
    /// the remaining spans.
    fn compact(&mut self, h: &mut Vec<f32>, width: usize) {
        let results = &self.results;
        let mut kept = Vec::with_capacity(h.len());
        let mut next_row = 0;
        self.seqs.retain_mut(|seq| {
            if results[seq.item].is_some() {
                return false;
            }
            let rows = seq.span.rows.clone();
            kept.extend_from_slice(&h[rows.start * width..rows.end * width]);
            seq.span.rows = next_row..next_row + rows.len();
            next_row += rows.len();
            true
        });
        *h = kept;
    }

    /// Every item's result, in the caller's order.
    pub fn into_results(self) -> Vec<Result<Vec<f32>>> {
        self.results
            .into_iter()
            .map(|r| r.expect("every sequence of a step ends with a result"))
            .collect()
    }
}

/// Splits `buf` (rows of `width`) into the rows of each span, in order. The spans must be
/// consecutive from row 0 (as a step lays them out).
pub fn split_rows<'b>(buf: &'b mut [f32], width: usize, spans: &[Span]) -> Vec<&'b mut [f32]> {
    let mut parts = Vec::with_capacity(spans.len());
    let mut rest = buf;
    for span in spans {
        let (head, tail) = rest.split_at_mut(span.tokens() * width);
        parts.push(head);
        rest = tail;
    }
    parts
}

/// Runs `f` on every part: in parallel when there are several (each part is one sequence's
/// own state and rows, so the result does not depend on which thread runs it), inline for one.
pub fn for_each_seq<T: Send>(parts: Vec<T>, f: impl Fn(T) + Sync + Send) {
    if parts.len() == 1 {
        parts.into_iter().for_each(f);
    } else {
        parts.into_par_iter().for_each(f);
    }
}
