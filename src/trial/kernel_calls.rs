//! Kernel calls of an op-level trace: the ops whose CUDA kernels choose an
//! algorithm or take scratch memory through the caching allocator (cuDNN's
//! convolutions, reductions split across blocks, ...), each with its
//! arguments and its place among the trace's events, so that the predictor
//! can add what the CUDA kernel would allocate there (`predict::kernels`).
//! Recorded by the shim's op-level fallback (`shim_kernel_calls.cpp`).

use crate::shim::ffi::{self, ShimError};

/// The ops recorded (ATen names, with the overload where only one is meant).
/// What the predictor models for each is in `predict::kernels`.
pub const RECORDED_OPS: &[&str] = &[
    "aten::convolution",
    "aten::convolution_backward",
    "aten::sum.dim_IntList",
    "aten::mean.dim",
    "aten::_softmax_backward_data",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::binary_cross_entropy_with_logits",
];

/// One argument of a recorded call, as the shim writes it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum KernelArg {
    /// A tensor: dtype name (`f32`, `bf16`, ...), sizes, and its layout.
    Tensor {
        dtype: String,
        sizes: Vec<i64>,
        layout: Layout,
    },
    Int(i64),
    Ints(Vec<i64>),
    Bool(bool),
    Bools(Vec<bool>),
    Float(f64),
    /// A tensor list, by its length.
    TensorList(usize),
    /// `None` or an undefined tensor.
    None,
    /// Any other kind of argument.
    Other,
}

/// A tensor's memory layout as a CUDA kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Layout {
    Contiguous,
    /// A 4-d tensor in channels-last order (NHWC).
    ChannelsLast,
    /// Neither: a strided view.
    Strided,
}

/// A line that is not a recorded call ([`KernelCall::to_line`]'s form).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel call `{line}`: {fault}")]
pub struct KernelCallParseError {
    pub line: String,
    pub fault: LineFault,
}

/// What is wrong with a [`KernelCallParseError`]'s line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineFault {
    #[error("does not start with `k`")]
    NoMarker,
    /// A field (`position`, `phase`, `scope`, `op`) missing.
    #[error("no {0}")]
    Missing(&'static str),
    /// A number field that does not parse.
    #[error("bad {0}")]
    Bad(&'static str),
    #[error("bad argument `{0}`")]
    BadArgument(String),
}

/// A recorded call: the op ran after `at` trace events (its outputs among
/// them), so the kernel's scratch sits between events `at - 1` and `at`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KernelCall {
    pub at: usize,
    pub phase: u32,
    pub scope: u32,
    /// ATen name with its overload (`aten::sum.dim_IntList`).
    pub op: String,
    pub args: Vec<KernelArg>,
}

impl KernelCall {
    /// The `i`-th tensor argument's (dtype, sizes, layout), if it is a tensor.
    pub fn tensor(&self, i: usize) -> Option<(&str, &[i64], Layout)> {
        match self.args.get(i) {
            Some(KernelArg::Tensor {
                dtype,
                sizes,
                layout,
            }) => Some((dtype.as_str(), sizes.as_slice(), *layout)),
            _ => None,
        }
    }
    pub fn ints(&self, i: usize) -> Option<&[i64]> {
        match self.args.get(i) {
            Some(KernelArg::Ints(v)) => Some(v),
            _ => None,
        }
    }
    pub fn int(&self, i: usize) -> Option<i64> {
        match self.args.get(i) {
            Some(KernelArg::Int(v)) => Some(*v),
            _ => None,
        }
    }
    pub fn bool(&self, i: usize) -> Option<bool> {
        match self.args.get(i) {
            Some(KernelArg::Bool(v)) => Some(*v),
            _ => None,
        }
    }
    pub fn bools(&self, i: usize) -> Option<&[bool]> {
        match self.args.get(i) {
            Some(KernelArg::Bools(v)) => Some(v),
            _ => None,
        }
    }

    /// The call as the shim writes it (`k AT PHASE SCOPE OP ARGS...`).
    pub fn to_line(&self) -> String {
        let mut line = format!("k {} {} {} {}", self.at, self.phase, self.scope, self.op);
        for a in &self.args {
            line.push(' ');
            line.push_str(&match a {
                KernelArg::Tensor {
                    dtype,
                    sizes,
                    layout,
                } => {
                    let dims = if sizes.is_empty() {
                        "s".to_string()
                    } else {
                        sizes
                            .iter()
                            .map(i64::to_string)
                            .collect::<Vec<_>>()
                            .join("x")
                    };
                    let suffix = match layout {
                        Layout::Contiguous => "",
                        Layout::ChannelsLast => ":cl",
                        Layout::Strided => ":nc",
                    };
                    format!("t:{dtype}:{dims}{suffix}")
                }
                KernelArg::Int(v) => format!("i:{v}"),
                KernelArg::Ints(v) if v.is_empty() => "l:e".into(),
                KernelArg::Ints(v) => format!(
                    "l:{}",
                    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
                ),
                KernelArg::Bool(b) => format!("b:{}", u8::from(*b)),
                KernelArg::Bools(v) => format!(
                    "m:{}",
                    v.iter()
                        .map(|b| u8::from(*b).to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                KernelArg::Float(f) => format!("f:{f}"),
                KernelArg::TensorList(n) => format!("n:{n}"),
                KernelArg::None => "-".into(),
                KernelArg::Other => "?".into(),
            });
        }
        line
    }

    /// Parses [`KernelCall::to_line`]'s form.
    pub fn from_line(line: &str) -> Result<KernelCall, KernelCallParseError> {
        let bad = |fault| KernelCallParseError {
            line: line.to_string(),
            fault,
        };
        let mut parts = line.split_ascii_whitespace();
        if parts.next() != Some("k") {
            return Err(bad(LineFault::NoMarker));
        }
        let mut number = |what: &'static str| -> Result<u64, KernelCallParseError> {
            parts
                .next()
                .ok_or_else(|| bad(LineFault::Missing(what)))?
                .parse()
                .map_err(|_| bad(LineFault::Bad(what)))
        };
        let at = number("position")? as usize;
        let phase = number("phase")? as u32;
        let scope = number("scope")? as u32;
        let op = parts
            .next()
            .ok_or_else(|| bad(LineFault::Missing("op")))?
            .to_string();
        let args = parts
            .map(|a| parse_arg(a).ok_or_else(|| bad(LineFault::BadArgument(a.to_string()))))
            .collect::<Result<_, _>>()?;
        Ok(KernelCall {
            at,
            phase,
            scope,
            op,
            args,
        })
    }
}

fn parse_list<T: std::str::FromStr>(text: &str) -> Option<Vec<T>> {
    if text == "e" {
        return Some(Vec::new());
    }
    text.split(',').map(|v| v.parse().ok()).collect()
}

fn parse_arg(text: &str) -> Option<KernelArg> {
    if text == "-" {
        return Some(KernelArg::None);
    }
    if text == "?" {
        return Some(KernelArg::Other);
    }
    let (kind, rest) = text.split_once(':')?;
    Some(match kind {
        "t" => {
            let mut fields = rest.split(':');
            let dtype = fields.next()?.to_string();
            let dims = fields.next()?;
            let sizes = if dims == "s" {
                Vec::new()
            } else {
                dims.split('x')
                    .map(|d| d.parse().ok())
                    .collect::<Option<_>>()?
            };
            let layout = match fields.next() {
                None => Layout::Contiguous,
                Some("cl") => Layout::ChannelsLast,
                Some("nc") => Layout::Strided,
                Some(_) => return None,
            };
            KernelArg::Tensor {
                dtype,
                sizes,
                layout,
            }
        }
        "i" => KernelArg::Int(rest.parse().ok()?),
        "l" => KernelArg::Ints(parse_list(rest)?),
        "b" => KernelArg::Bool(rest == "1"),
        "m" => KernelArg::Bools(
            parse_list::<u8>(rest)?
                .into_iter()
                .map(|b| b == 1)
                .collect(),
        ),
        "f" => KernelArg::Float(rest.parse().ok()?),
        "n" => KernelArg::TensorList(rest.parse().ok()?),
        _ => return None,
    })
}

/// Starts recording [`RECORDED_OPS`] (`true`) or stops (`false`); either
/// forgets the calls recorded so far. Calls are recorded only while an
/// op-level trace runs.
pub fn record(on: bool) -> Result<(), ShimError> {
    let list = if on {
        RECORDED_OPS.join(",")
    } else {
        String::new()
    };
    let list = std::ffi::CString::new(list).expect("op names have no NUL");
    // SAFETY: a NUL-terminated string the shim copies.
    let rc = unsafe { ffi::segtune_kernel_calls_record(list.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(ShimError {
            call: "segtune_kernel_calls_record",
            message: "cannot record kernel calls".into(),
        })
    }
}

/// Takes the calls recorded so far, and every op's work recorded with them.
pub fn take() -> Result<(Vec<KernelCall>, Vec<super::op_work::OpWork>), ShimError> {
    // SAFETY: the shim returns a NUL-terminated string it keeps until the next call.
    let text = unsafe { ffi::shim_string(ffi::segtune_kernel_calls_take()) };
    let shim_error = |message: String| ShimError {
        call: "segtune_kernel_calls_take",
        message,
    };
    let mut calls = Vec::new();
    let mut work = Vec::new();
    for line in text.lines() {
        if line.starts_with("w ") {
            work.push(
                super::op_work::OpWork::from_line(line).map_err(|e| shim_error(e.to_string()))?,
            );
        } else {
            calls.push(KernelCall::from_line(line).map_err(|e| shim_error(e.to_string()))?);
        }
    }
    Ok((calls, work))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_round_trips_through_its_line() {
        let call = KernelCall {
            at: 12,
            phase: 10,
            scope: 3,
            op: "aten::convolution_backward".into(),
            args: vec![
                KernelArg::Tensor {
                    dtype: "bf16".into(),
                    sizes: vec![2, 64, 32, 32],
                    layout: Layout::ChannelsLast,
                },
                KernelArg::Tensor {
                    dtype: "f32".into(),
                    sizes: vec![],
                    layout: Layout::Contiguous,
                },
                KernelArg::None,
                KernelArg::Ints(vec![1, 1]),
                KernelArg::Ints(vec![]),
                KernelArg::Int(-1),
                KernelArg::Bool(true),
                KernelArg::Bools(vec![true, false, true]),
                KernelArg::Float(0.5),
                KernelArg::TensorList(7),
                KernelArg::Other,
            ],
        };
        let line = call.to_line();
        assert_eq!(
            line,
            "k 12 10 3 aten::convolution_backward t:bf16:2x64x32x32:cl t:f32:s - l:1,1 l:e i:-1 b:1 m:1,0,1 f:0.5 n:7 ?"
        );
        assert_eq!(KernelCall::from_line(&line).unwrap(), call);
        assert!(KernelCall::from_line("k 1 2 3 aten::x t:f32:2xq").is_err());
    }
}
