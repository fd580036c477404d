//! `drafs init` and `drafs get` against the test API server.

mod support;

use std::time::Duration;

use support::*;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn init_writes_the_tree_of_a_template_claim() {
    let api = api_for("ml");
    api.load_yaml(&read("examples/gpu-training.yaml"));
    let env = Env::new(&api, "ml", "trainer-0", TOKEN);
    let dir = env.path("dra");
    let out = env.run(&["init", "--dir", dir.to_str().unwrap(), "--timeout", "30s"], LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    let tree = read_tree(&dir);
    assert_eq!(tree["gpu/gpu/0/uuid"], "GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");
    assert_eq!(tree["gpu/gpu/0/resource.kubernetes.io/pciBusID"], "0000:5e:00.0");
    assert_eq!(tree[".ready"], "");
}
