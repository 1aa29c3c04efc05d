//! `segtune search`: the best feasible training config for a GPU budget.
//!
//! The space (batch x crop x AMP, accumulation keeping the recipe's
//! effective batch) is searched per (crop, AMP) by binary search over the
//! batch sizes, each candidate predicted from CPU traces (see `predict`).
//! On a CUDA device, short real training trials, each in its own process,
//! then confirm the predicted ranking from the top down; without one, the
//! predictions are the answer, and say so. Every finished trial goes to the journal at
//! once; a re-run redoes none.
//!
//! - `spec.rs`: the settings (command line over the config's `segtune` dict).
//! - `recipe.rs`: the recipe as the user runs it (effective batch,
//!   precision, schedule) and the changes a search makes to it.
//! - `space.rs`: the candidates' axes; `knobs.rs`: every
//!   knob as data (where it applies, its config keys, cost, stage, column).
//! - `evaluate/`: measured and predicted evaluators behind one trait.
//! - `strategy.rs`: the binary search and the ranking, on one evaluator or
//!   several at once; `placement.rs`: where trials run (`--devices`,
//!   `--launcher slurm`).
//! - `confirm.rs`: on a GPU, real trials confirming the predicted ranking.
//! - `infer.rs`: `--mode infer`, the inference settings (test batch, whole
//!   or slide, fp16) for the test images.
//! - `journal.rs`: the append-only record of trials.
//! - `edits.rs`: what a written config sets (each edit with its reason),
//!   the child's overrides, the `--cfg-options` line and the changes list;
//! - `emit.rs`: the winner written as an MMSeg config;
//!   `emit_hf.rs`: for a Hugging Face model, as `training_args.json` and
//!   `preprocessor_config.json`.
//! - `record.rs`: the records and the result; `run.rs`: the whole search;
//!   `checks.rs`: what it refuses before and after its trials.
//! - `saved.rs`: `search.json`, the finished search for `segtune report`;
//!   `owned.rs`: which files in `--out` are segtune's to replace.
//! - `atlas.rs`: `segtune atlas`, a search per config and GPU, with the
//!   published results beside them and the traces shared.

pub mod atlas;
pub mod checks;
pub mod confirm;
pub mod edits;
pub mod emit;
pub mod emit_hf;
pub mod evaluate;
pub mod infer;
pub mod journal;
pub mod knobs;
pub mod owned;
pub mod placement;
pub mod recipe;
pub mod record;
pub mod run;
pub mod saved;
pub mod space;
pub mod spec;
pub mod strategy;
pub mod winner;

pub use placement::{Devices, Placement, SlurmOptions};
pub use record::{CandidateStatus, Mode, Outcome, SearchResult, TrialRecord};
pub use run::{search, search_with, RealTrials, SearchRequest, SearchRun};
pub use spec::{DeviceSetting, Objective, SearchSpec};
pub use strategy::{Progress, Step};
pub use winner::changes_words;
