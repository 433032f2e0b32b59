//! `hoard runner setup --arc`: the same preload and hook for actions-runner-controller's
//! `gha-runner-scale-set`, as text to apply, touching no cluster. A ConfigMap holds the two files;
//! the runner container mounts it at `/home/runner/.hoard` (the runner image's root is
//! `/home/runner`, so the hook finds the runner's Node in `../externals`) and gets in its `env`
//! what `setup` would put in `.env`.

use std::fmt::Write as _;

use super::env_file::{
    BUILD_TOOLS, CACHE_URL, CUSTOM_CACHE_URL, CUSTOM_RESULTS_URL, HOOK, NODE_OPTIONS, RESULTS_URL,
};
use super::files;

/// The ConfigMap's and the volume's name.
pub const NAME: &str = "hoard-runner";
/// Where the runner container mounts the ConfigMap.
pub const MOUNT: &str = "/home/runner/.hoard";

/// The variable the runner container gets its node's address in (`status.hostIP`).
pub const NODE_IP: &str = "HOARD_NODE_IP";

/// The URL of the edge on the runner's node, listening on host port `port`, as the container's
/// env spells it (Kubernetes puts the node's address in `$(HOARD_NODE_IP)`).
pub fn node_edge(port: u16) -> String {
    format!("http://$({NODE_IP}):{port}/")
}

/// A YAML block scalar of `text` at `indent` spaces (`text` ends with one newline).
fn block(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::from("|\n");
    for line in text.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, "{pad}{line}");
        }
    }
    out
}

/// A YAML double-quoted string (JSON's escapes are YAML's).
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// Two YAML documents: the ConfigMap, and the part of the scale set's values file.
pub fn render(
    results_url: Option<&str>,
    cache_url: Option<&str>,
    build_tools: Option<&str>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# hoard runner setup --arc (hoard {}). Two YAML documents:",
        env!("CARGO_PKG_VERSION")
    );
    out.push_str(
        "# 1. A ConfigMap with the preload and the job-started hook: apply it in the runners' namespace\n\
         #    (kubectl apply -n RUNNER_NAMESPACE -f FILE).\n\
         # 2. What to merge into the gha-runner-scale-set values file: the runner container's env\n\
         #    and volumeMounts and the pod's volume. It works with no containerMode, with\n\
         #    containerMode dind and with containerMode kubernetes (docs/runners.md says what each covers).\n\
         #    If the runner container already sets ACTIONS_RUNNER_HOOK_JOB_STARTED, move that value\n\
         #    to HOARD_CHAINED_JOB_STARTED_HOOK: hoard's hook runs it after its own check.\n",
    );
    let _ = writeln!(
        out,
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {NAME}\ndata:"
    );
    for (name, text) in files::all() {
        let _ = write!(out, "  {name}: {}", block(&text, 4));
    }
    let _ = writeln!(out, "---\ntemplate:\n  spec:\n    containers:\n      - name: runner\n        image: ghcr.io/actions/actions-runner:latest\n        command: [\"/home/runner/run.sh\"]\n        env:");
    // The node's address first: later values may name it as $(HOARD_NODE_IP).
    let node_edge = [results_url, cache_url]
        .iter()
        .flatten()
        .any(|url| url.contains(&format!("$({NODE_IP})")));
    if node_edge {
        let _ = writeln!(
            out,
            "          - name: {NODE_IP}\n            valueFrom:\n              fieldRef:\n                fieldPath: status.hostIP"
        );
    }
    let mut env = Vec::new();
    if let Some(url) = results_url {
        env.push((RESULTS_URL, url.to_owned()));
    }
    if let Some(url) = cache_url {
        env.push((CACHE_URL, url.to_owned()));
    }
    if let Some(url) = results_url {
        env.push((CUSTOM_RESULTS_URL, url.to_owned()));
    }
    if let Some(url) = cache_url {
        env.push((CUSTOM_CACHE_URL, url.to_owned()));
    }
    if let Some(tools) = build_tools {
        env.push((BUILD_TOOLS, tools.to_owned()));
    }
    env.push((
        NODE_OPTIONS,
        format!("--require {MOUNT}/{}", files::PRELOAD_NAME),
    ));
    env.push((HOOK, format!("{MOUNT}/{}", files::HOOK_NAME)));
    for (name, value) in env {
        let _ = writeln!(
            out,
            "          - name: {name}\n            value: {}",
            quoted(&value)
        );
    }
    let _ = writeln!(
        out,
        "        volumeMounts:\n          - name: {NAME}\n            mountPath: {MOUNT}\n            readOnly: true\n    volumes:\n      - name: {NAME}\n        configMap:\n          name: {NAME}\n          defaultMode: 0755"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_at_its_nodes_edge_gets_the_nodes_address_first() {
        let edge = node_edge(3100);
        let out = render(Some(&edge), Some(&edge), None);
        let at = |needle: &str| {
            out.find(needle)
                .unwrap_or_else(|| panic!("{needle}:\n{out}"))
        };
        assert!(at("fieldPath: status.hostIP") < at("http://$(HOARD_NODE_IP):3100/"));
        assert!(!render(Some("http://hoard:3000/"), None, None).contains(NODE_IP));
    }

    #[test]
    fn block_scalars_keep_the_text() {
        assert_eq!(block("a\n\n  b\n", 2), "|\n  a\n\n    b\n");
    }
}
