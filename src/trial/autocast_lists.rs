//! CUDA autocast's op lists by PyTorch release. segtune emulates libtorch
//! 2.11's CUDA lists on the CPU (`shim.cpp`); an older release listed fewer
//! ops (they then run in the dtype they are given) and two that 2.11 no
//! longer lists. Read from each release's own build (the
//! `at::autocast::WrapFunction_` instantiations of the PyPI wheel's
//! `libtorch_cpu`, cross-checked with `autocast_mode.cpp`/`.h` where the
//! text was readable), 1.8.0 to 2.11.0; every patch release checked had its
//! X.Y.0's lists.

use crate::kinds::TorchVersion;

/// An op of 2.11's CUDA lists that an older release did not list.
#[derive(Debug, Clone, Copy)]
pub struct ListedSince {
    /// `aten::name[.overload]`, as the dispatcher registers it.
    pub op: &'static str,
    /// Its policy in 2.11.
    pub policy: &'static str,
    pub since: TorchVersion,
}

const fn since(op: &'static str, policy: &'static str, major: u32, minor: u32) -> ListedSince {
    ListedSince {
        op,
        policy,
        since: TorchVersion::new(major, minor),
    }
}

/// Every op of 2.11's CUDA lists that some release from 1.8 did not list
/// (the rest of 2.11's 125 entries are listed, with the same policy, in
/// every release from 1.8; `grid_sampler` was fp32 in 1.9, see
/// [`fp32_in_release`]).
pub const LISTED_SINCE: &[ListedSince] = &[
    // "Correctly handle F.interpolate upsample with amp" (pytorch#121072):
    // upsampling in fp32 from 2.4; before, in the dtype it is given.
    since("aten::upsample_nearest1d", "fp32", 2, 4),
    since("aten::upsample_nearest2d", "fp32", 2, 4),
    since("aten::upsample_nearest3d", "fp32", 2, 4),
    since("aten::_upsample_nearest_exact1d", "fp32", 2, 4),
    since("aten::_upsample_nearest_exact2d", "fp32", 2, 4),
    since("aten::_upsample_nearest_exact3d", "fp32", 2, 4),
    since("aten::upsample_linear1d", "fp32", 2, 4),
    since("aten::upsample_bilinear2d", "fp32", 2, 4),
    since("aten::_upsample_bilinear2d_aa", "fp32", 2, 4),
    since("aten::upsample_trilinear3d", "fp32", 2, 4),
    since("aten::upsample_bicubic2d", "fp32", 2, 4),
    since("aten::_upsample_bicubic2d_aa", "fp32", 2, 4),
    since("aten::vdot", "promote", 2, 4),
    since("aten::linalg_vecdot", "lower_precision_fp", 2, 2),
    // pytorch#91066 (scaled_dot_product_attention under autocast).
    since(
        "aten::scaled_dot_product_attention",
        "lower_precision_fp",
        2,
        0,
    ),
    since(
        "aten::_scaled_dot_product_flash_attention",
        "lower_precision_fp",
        2,
        0,
    ),
    since("aten::linalg_vector_norm", "fp32_set_opt_dtype", 2, 0),
    since("aten::linalg_matrix_norm", "fp32_set_opt_dtype", 2, 0),
    since(
        "aten::linalg_matrix_norm.str_ord",
        "fp32_set_opt_dtype",
        2,
        0,
    ),
    since("aten::logsumexp", "fp32", 1, 13),
    // pytorch#71916 ("Add Autocast support for Einsum").
    since("aten::einsum", "lower_precision_fp", 1, 12),
    // pytorch#58618 (promote from 1.10; 1.9 had it in fp32, pytorch#58679).
    since("aten::grid_sampler", "promote", 1, 10),
    since("aten::huber_loss", "fp32", 1, 9),
    since("aten::linalg_multi_dot", "lower_precision_fp", 1, 9),
    since("aten::scatter_add", "promote", 1, 9),
];

/// The ops of 2.11's lists that `torch` does not list: under its autocast
/// they run in the dtype they are given.
pub fn unlisted_in(torch: TorchVersion) -> Vec<&'static str> {
    LISTED_SINCE
        .iter()
        .filter(|l| torch < l.since)
        .map(|l| l.op)
        .collect()
}

/// The ops `torch` runs in fp32 under autocast that 2.11 does not: `gelu`
/// up to 1.9 (pytorch#59639 removed it in 1.10) and `grid_sampler` in 1.9
/// (pytorch#58679, then promote). Other entries of old lists that 2.11 no
/// longer has are not modelled: `cat`/`stack`/`_cat`/`equal` in the
/// promote list up to 1.9 (their fp32 copies are transient; 1.10's `cat`
/// promotes by itself) and ops ATen has since removed (`frobenius_norm`,
/// the deprecated `cudnn_convolution` overloads, `_convolution_nogroup`).
pub fn fp32_in_release(torch: TorchVersion) -> Vec<&'static str> {
    let mut ops = Vec::new();
    if torch <= TorchVersion::new(1, 9) {
        ops.push("aten::gelu");
    }
    if torch == TorchVersion::new(1, 9) {
        ops.push("aten::grid_sampler");
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_release_lists_what_its_build_registered() {
        let v = TorchVersion::new;
        // The counts of 2.11 entries each release lacks, from the wheels.
        for (release, missing) in [
            (v(1, 8), 25),
            (v(1, 9), 21),
            (v(1, 10), 21),
            (v(1, 12), 20),
            (v(1, 13), 19),
            (v(2, 0), 14),
            (v(2, 2), 13),
            (v(2, 3), 13),
            (v(2, 4), 0),
            (v(2, 11), 0),
        ] {
            // 1.9 lists grid_sampler too, in fp32 rather than promote.
            let lacking = unlisted_in(release).len() - usize::from(release == v(1, 9));
            assert_eq!(lacking, missing, "{release}");
        }
        assert!(unlisted_in(v(2, 3)).contains(&"aten::upsample_bilinear2d"));
        assert!(!unlisted_in(v(2, 4)).contains(&"aten::upsample_bilinear2d"));
        assert_eq!(fp32_in_release(v(1, 8)), vec!["aten::gelu"]);
        assert_eq!(
            fp32_in_release(v(1, 9)),
            vec!["aten::gelu", "aten::grid_sampler"]
        );
        assert!(fp32_in_release(v(1, 10)).is_empty());
    }
}
