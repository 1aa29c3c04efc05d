//! The work of every op of an op-level trace: its name, the step phase it
//! ran in, and the bytes of the tensors it took and returned, recorded by
//! the shim's op-level fallback (`shim_kernel_calls.cpp`, `w` lines) beside
//! the kernel calls. The step-time model (`predict::speed`) times each as
//! the CUDA kernel it would launch; the GEMMs and convolutions among them
//! it times by the shapes of their kernel calls instead.

/// One op of a traced step.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpWork {
    /// The phase code of the trace's events (`trace::phase_of`: the step
    /// and its part).
    pub phase: u32,
    /// The ATen op with its overload (`aten::add.Tensor`).
    pub op: String,
    /// Bytes of the tensors among its arguments.
    pub in_bytes: u64,
    /// Bytes of the tensors it returned (0 for a view).
    pub out_bytes: u64,
    /// Every return aliases an argument and none is written: no kernel.
    pub view: bool,
}

/// Why a `w` line does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("op work line `{line}`: {what}")]
pub struct OpWorkParseError {
    pub line: String,
    pub what: &'static str,
}

impl OpWork {
    /// The line as the shim writes it (`w PHASE OP IN_BYTES OUT_BYTES VIEW`).
    pub fn to_line(&self) -> String {
        format!(
            "w {} {} {} {} {}",
            self.phase,
            self.op,
            self.in_bytes,
            self.out_bytes,
            u8::from(self.view)
        )
    }

    /// Parses [`OpWork::to_line`]'s form.
    pub fn from_line(line: &str) -> Result<OpWork, OpWorkParseError> {
        let bad = |what| OpWorkParseError {
            line: line.chars().take(200).collect(),
            what,
        };
        let mut parts = line.split_ascii_whitespace();
        if parts.next() != Some("w") {
            return Err(bad("no `w` marker"));
        }
        let phase = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| bad("bad phase"))?;
        let op = parts.next().ok_or_else(|| bad("no op"))?.to_string();
        let mut number = |what| {
            parts
                .next()
                .and_then(|p| p.parse::<u64>().ok())
                .ok_or_else(|| bad(what))
        };
        let in_bytes = number("bad input bytes")?;
        let out_bytes = number("bad output bytes")?;
        let view = number("bad view flag")? == 1;
        Ok(OpWork {
            phase,
            op,
            in_bytes,
            out_bytes,
            view,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_round_trips_through_its_line() {
        let op = OpWork {
            phase: 17,
            op: "aten::add_.Tensor".into(),
            in_bytes: 4096,
            out_bytes: 2048,
            view: false,
        };
        assert_eq!(OpWork::from_line(&op.to_line()).unwrap(), op);
        assert!(OpWork::from_line("w 1 aten::view").is_err());
        assert!(OpWork::from_line("k 1 2 3").is_err());
    }
}
