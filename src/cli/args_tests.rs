use super::*;
use clap::Parser;

#[derive(clap::Parser)]
struct Worker {
    #[command(subcommand)]
    command: WorkerCommand,
}

#[derive(clap::Subcommand)]
enum WorkerCommand {
    Trial(TrialArgs),
}

fn parse(argv: Vec<std::ffi::OsString>) -> TrialRequest {
    let mut full = vec![std::ffi::OsString::from("segtune-torch")];
    full.extend(argv);
    let WorkerCommand::Trial(args) = Worker::try_parse_from(full).unwrap().command;
    args.request()
}

#[test]
fn a_request_survives_the_worker_command_line() {
    let plain = TrialRequest::new("cfg.py");
    assert_eq!(parse(vec!["trial".into(), "cfg.py".into()]), plain);
    assert_eq!(TrialRequest::from_json(&plain.to_json()).unwrap(), plain);
    let full = TrialRequest {
        cfg_options: vec!["crop_size=(64,64)".into(), "a.b=1".into()],
        batch_size: 3,
        crop: (256, 128),
        amp: Amp::Bf16,
        accumulative_counts: Some(4),
        warmup_steps: 2,
        measured_steps: 1,
        device: DeviceChoice::Cuda(1),
        seed: 7,
        ignore_fraction: 0.0,
        gt_segments: Some(12),
        threads: Some(2),
        cpu_cap_bytes: Some(1 << 30),
        trace_out: Some("/tmp/x.trace".into()),
        setup: TrainingSetup {
            gpus: 8,
            torch: TorchVersion::ZOO_2021,
            mmcv: MmcvVersion::new(1, 2, 4),
        },
        as_cuda: true,
        cudnn_benchmark: Some(false),
        ..TrialRequest::new("cfg.rhai")
    };
    // The worker's request: the same request back from its JSON.
    assert_eq!(TrialRequest::from_json(&full.to_json()).unwrap(), full);
    // `segtune trial`'s flags build it too.
    let flags = "trial cfg.rhai --batch-size 3 --crop 256x128 --amp bf16 --accum 4 \
                 --warmup 2 --steps 1 --device cuda:1 --seed 7 --ignore-fraction 0 \
                 --gt-segments 12 --threads 2 --cpu-cap 1073741824 --trace-out /tmp/x.trace \
                 --gpus 8 --torch 1.10 --mmcv 1.2.4 --as-cuda --cudnn-benchmark off \
                 --cfg-options crop_size=(64,64) a.b=1";
    assert_eq!(
        parse(flags.split_whitespace().map(Into::into).collect()),
        full
    );
}
