//! Measured cuDNN workspaces: what a real GPU chose and took for each
//! convolution of a trial, with benchmark on and off, as
//! `scripts/gpu-validate.sh` records them into
//! `tests/fixtures/cudnn_workspace_sm<XY>_<cudnn version>.csv`. The
//! predictor uses the table whose architecture matches the GPU asked for
//! (`for_compute_capability`): its algorithm is the winner of that shape and
//! its workspace replaces the formula's. The tables are compiled in
//! (build.rs lists them).
//!
//! Columns: `direction` (forward, backward_data, backward_filter), `n,c,h,w`
//! (the input), `k,r,s` (the filter), `stride_h,stride_w,pad_h,pad_w,
//! dilation_h,dilation_w,groups`, `dtype` (f32, f16, bf16), `layout` (nchw,
//! nhwc), `benchmark` (0/1), `algo` (cuDNN's enum name), `workspace_bytes`.

use super::conv::{ConvProblem, DataType, Direction};
use super::cudnn_algos::{Algo, ALGORITHMS};
use std::collections::HashMap;

include!(concat!(env!("OUT_DIR"), "/cudnn_tables.rs"));

type Key = (ConvProblem, Direction);

/// A measured table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkspaceTable {
    /// Where it came from (`sm90_91900`).
    pub name: String,
    /// (shape, direction, benchmark) -> the algorithm chosen.
    winners: HashMap<(Key, bool), Algo>,
    /// (shape, direction, algorithm) -> its workspace.
    workspaces: HashMap<(Key, Algo), u64>,
}

const COLUMNS: &[&str] = &[
    "direction",
    "n",
    "c",
    "h",
    "w",
    "k",
    "r",
    "s",
    "stride_h",
    "stride_w",
    "pad_h",
    "pad_w",
    "dilation_h",
    "dilation_w",
    "groups",
    "dtype",
    "layout",
    "benchmark",
    "algo",
    "workspace_bytes",
];

/// One row of a table: a convolution, the algorithm cuDNN chose for it
/// with benchmark on or off, and its workspace.
struct Row {
    problem: ConvProblem,
    direction: Direction,
    benchmark: bool,
    algo: Algo,
    bytes: u64,
}

/// Parses a row's `cells` (`at`: each of [`COLUMNS`]' position); `bad`
/// places a message at the row.
fn parse_row(
    at: &[usize],
    cells: &[&str],
    bad: &dyn Fn(String) -> TableError,
) -> Result<Row, TableError> {
    let cell = |j: usize| {
        cells
            .get(at[j])
            .copied()
            .ok_or_else(|| bad(format!("no `{}`", COLUMNS[j])))
    };
    let int = |j: usize| -> Result<i64, TableError> {
        cell(j)?
            .parse()
            .map_err(|_| bad(format!("`{}` is not an integer", COLUMNS[j])))
    };
    let direction = match cell(0)? {
        "forward" => Direction::Forward,
        "backward_data" => Direction::BackwardData,
        "backward_filter" => Direction::BackwardFilter,
        d => return Err(bad(format!("unknown direction `{d}`"))),
    };
    let dtype = match cell(15)? {
        "f32" => DataType::F32,
        "f16" => DataType::F16,
        "bf16" => DataType::Bf16,
        d => return Err(bad(format!("unknown dtype `{d}`"))),
    };
    let channels_last = match cell(16)? {
        "nchw" => false,
        "nhwc" => true,
        l => return Err(bad(format!("unknown layout `{l}` (nchw or nhwc)"))),
    };
    let algo_name = cell(18)?;
    let algo = ALGORITHMS
        .iter()
        .find(|a| a.name == algo_name)
        .map(|a| a.algo)
        .ok_or_else(|| bad(format!("unknown algorithm `{algo_name}`")))?;
    if algo.spec().direction != direction {
        return Err(bad(format!(
            "{algo_name} does not compute the {}",
            direction.name()
        )));
    }
    let (n, c, h, w, k, r, s) = (
        int(1)?,
        int(2)?,
        int(3)?,
        int(4)?,
        int(5)?,
        int(6)?,
        int(7)?,
    );
    let stride = [int(8)?, int(9)?];
    let pad = [int(10)?, int(11)?];
    let dilation = [int(12)?, int(13)?];
    let out = |i: usize, size: i64, kernel: i64| {
        (size + 2 * pad[i] - dilation[i] * (kernel - 1) - 1) / stride[i].max(1) + 1
    };
    let problem = ConvProblem {
        n,
        c,
        h,
        w,
        k,
        r,
        s,
        ho: out(0, h, r),
        wo: out(1, w, s),
        stride,
        pad,
        dilation,
        groups: int(14)?,
        dtype,
        channels_last,
    };
    let benchmark = int(17)? != 0;
    let bytes = int(19)?;
    if bytes < 0 {
        return Err(bad("negative workspace".into()));
    }
    Ok(Row {
        problem,
        direction,
        benchmark,
        algo,
        bytes: bytes as u64,
    })
}

/// Where a workspace table is malformed (`file:line: what`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{table}{}: {what}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct TableError {
    pub table: String,
    /// 1-based, counting blank lines; `None` for the table as a whole.
    pub line: Option<usize>,
    pub what: String,
}

impl WorkspaceTable {
    /// Parses a table (`name` for messages: `file:line: what`).
    pub fn parse(name: &str, text: &str) -> Result<WorkspaceTable, TableError> {
        let error = |line: Option<usize>, what: String| TableError {
            table: name.to_string(),
            line,
            what,
        };
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let header: Vec<&str> = lines
            .next()
            .ok_or_else(|| error(None, "empty table".into()))?
            .1
            .split(',')
            .map(str::trim)
            .collect();
        let col = |c: &str| header.iter().position(|h| *h == c);
        let at: Vec<usize> = COLUMNS
            .iter()
            .map(|c| col(c).ok_or_else(|| error(Some(1), format!("no `{c}` column"))))
            .collect::<Result<_, _>>()?;
        let mut table = WorkspaceTable {
            name: name.to_string(),
            ..Default::default()
        };
        for (i, line) in lines {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let bad = |what: String| error(Some(i + 1), what);
            let row = parse_row(&at, &cells, &bad)?;
            table
                .winners
                .insert(((row.problem, row.direction), row.benchmark), row.algo);
            table
                .workspaces
                .insert(((row.problem, row.direction), row.algo), row.bytes);
        }
        Ok(table)
    }

    /// The compiled-in table for a compute capability (`8.6` -> `sm86_*`).
    pub fn for_compute_capability(cc: &str) -> Option<&'static WorkspaceTable> {
        // Parsed once per process: every replay of every estimate asks.
        static PARSED: std::sync::LazyLock<Vec<WorkspaceTable>> = std::sync::LazyLock::new(|| {
            TABLES
                .iter()
                .map(|(name, text)| {
                    WorkspaceTable::parse(name, text)
                        .unwrap_or_else(|e| panic!("compiled-in cuDNN table: {e}"))
                })
                .collect()
        });
        let sm = format!("sm{}", cc.replace('.', ""));
        PARSED
            .iter()
            .find(|t| t.name.split('_').next() == Some(sm.as_str()))
    }

    /// The names of the compiled-in tables.
    pub fn compiled_in() -> Vec<&'static str> {
        TABLES.iter().map(|(name, _)| *name).collect()
    }

    /// The algorithm the GPU chose for this shape, if measured.
    pub fn winner(&self, p: &ConvProblem, d: Direction, benchmark: bool) -> Option<Algo> {
        self.winners.get(&((*p, d), benchmark)).copied()
    }

    /// The workspace the GPU's algorithm took for this shape, if measured.
    pub fn workspace(&self, p: &ConvProblem, d: Direction, algo: Algo) -> Option<u64> {
        self.workspaces.get(&((*p, d), algo)).copied()
    }

    pub fn len(&self) -> usize {
        self.workspaces.len()
    }
    pub fn is_empty(&self) -> bool {
        self.workspaces.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
direction,n,c,h,w,k,r,s,stride_h,stride_w,pad_h,pad_w,dilation_h,dilation_w,groups,dtype,layout,benchmark,algo,workspace_bytes
forward,2,4096,64,128,512,3,3,1,1,1,1,1,1,1,f32,nchw,1,CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,49160
forward,2,4096,64,128,512,3,3,1,1,1,1,1,1,1,f32,nchw,0,CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,1006632960
backward_filter,2,64,128,256,64,3,3,1,1,1,1,1,1,1,f16,nhwc,1,CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,1024
";

    #[test]
    fn a_measured_table_gives_the_winner_and_its_workspace_per_mode() {
        let t = WorkspaceTable::parse("sm70_8005", TABLE).unwrap();
        assert_eq!(t.len(), 3);
        let p = super::super::conv::psp_bottleneck(DataType::F32);
        assert_eq!(
            t.winner(&p, Direction::Forward, true),
            Some(Algo::FwdImplicitPrecompGemm)
        );
        assert_eq!(
            t.winner(&p, Direction::Forward, false),
            Some(Algo::FwdWinogradNonfused)
        );
        assert_eq!(
            t.workspace(&p, Direction::Forward, Algo::FwdWinogradNonfused),
            Some(1_006_632_960)
        );
        assert_eq!(t.winner(&p, Direction::BackwardData, true), None);
    }

    #[test]
    fn a_bad_row_is_named_by_file_and_line() {
        let bad = TABLE.replace("f16,nhwc", "f16,nhcw");
        let e = WorkspaceTable::parse("t.csv", &bad).unwrap_err();
        assert_eq!(e.line, Some(4));
        let e = e.to_string();
        assert!(e.starts_with("t.csv:4: unknown layout `nhcw`"), "{e}");
        let bad = TABLE.replace("BWD_FILTER_ALGO_1", "FWD_ALGO_GEMM");
        let e = WorkspaceTable::parse("t.csv", &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not compute the backward filter"), "{e}");
        let e = WorkspaceTable::parse("t.csv", "direction,n\nforward,1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `c` column"), "{e}");
    }
}
