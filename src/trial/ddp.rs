//! What `DistributedDataParallel` adds to each GPU's memory: its gradient
//! buckets. With `gradient_as_bucket_view=False` (the default, and what
//! MMEngine's and mmcv's DDP wrappers pass), the reducer allocates one flat
//! buffer per bucket at wrapping time and keeps it for the whole run, next
//! to the parameters' own `.grad` tensors: one more copy of the trainable
//! parameters' bytes, in buckets.

use crate::models::params::ParamStore;
use tch::{Device, Kind, Tensor};

/// `torch.distributed`'s `_DEFAULT_FIRST_BUCKET_BYTES`: the first bucket is
/// small so that the first all-reduce starts early.
const FIRST_BUCKET_BYTES: i64 = 1024 * 1024;
/// DDP's default `bucket_cap_mb=25`.
const BUCKET_BYTES: i64 = 25 * 1024 * 1024;

/// The bucket sizes (elements) DDP's `_compute_bucket_assignment_by_size`
/// gives parameters of these byte sizes, in registration order: a bucket
/// closes once it reaches its limit (1 MiB for the first, 25 MiB after).
pub fn bucket_sizes(param_bytes: &[i64], element_size: i64) -> Vec<i64> {
    let mut buckets = Vec::new();
    let mut current = 0;
    let mut limit = FIRST_BUCKET_BYTES;
    for &bytes in param_bytes {
        current += bytes;
        if current >= limit {
            buckets.push(current / element_size);
            current = 0;
            limit = BUCKET_BYTES;
        }
    }
    if current > 0 {
        buckets.push(current / element_size);
    }
    buckets
}

/// Allocates the gradient buckets of a `world_size`-GPU DDP run on
/// `device` (nothing for one GPU). Keep the result alive for the run.
/// Parameters are float32 (segtune builds models in fp32, as MMSeg does).
pub fn allocate_buckets(store: &ParamStore, world_size: i64, device: Device) -> Vec<Tensor> {
    if world_size <= 1 {
        return Vec::new();
    }
    let bytes: Vec<i64> = store
        .params
        .iter()
        .filter(|p| p.trainable())
        .map(|p| p.tensor.numel() as i64 * p.tensor.kind().elt_size_in_bytes() as i64)
        .collect();
    bucket_sizes(&bytes, 4)
        .into_iter()
        .map(|n| Tensor::empty([n], (Kind::Float, device)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bucket_closes_at_one_mib_then_every_25_mib() {
        let mib = 1024 * 1024;
        // 0.5 + 0.75 MiB close the first bucket; 20 + 10 close the second; 3 is left.
        let sizes = bucket_sizes(&[mib / 2, 3 * mib / 4, 20 * mib, 10 * mib, 3 * mib], 4);
        assert_eq!(sizes, vec![(5 * mib / 4) / 4, 30 * mib / 4, 3 * mib / 4]);
        let total: i64 = sizes.iter().sum();
        assert_eq!(total * 4, mib / 2 + 3 * mib / 4 + 33 * mib);
    }
}
