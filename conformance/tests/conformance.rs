//! The conformance test binary: every case against every registered backend.

fn main() {
    conformance::harness::main();
}
