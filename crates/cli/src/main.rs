// opdump compare: under construction.
fn main() {}
