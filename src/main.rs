fn main() {
    std::process::exit(segtune::cli::main());
}
