//! The drafs container's requests and limits (pure): its defaults, what
//! `inject`'s and the webhook's flags and a pod's `drafs.dev/resources`
//! annotation make of them.
//!
//! A namespace whose ResourceQuota covers `limits.cpu` (or any resource the
//! defaults leave out) refuses every pod with a container that does not set
//! it, unless a LimitRange gives a default: such a namespace sets the limit
//! here.

use serde_json::{Map, Value, json};

/// The annotation: `cpu-limit=100m,memory-limit=64Mi` (each key optional).
pub const RESOURCES_ANNOTATION: &str = "drafs.dev/resources";

/// Requests and limits of the drafs container; `None`: not set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request: Option<String>,
    pub memory_request: Option<String>,
    pub cpu_limit: Option<String>,
    pub memory_limit: Option<String>,
}

/// What drafs needs: a tree of a node's 8 GPUs is under 3 MiB; the limit
/// keeps a runaway from the pod's other containers (docs/deploy.md).
impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpu_request: Some("10m".into()),
            memory_request: Some("16Mi".into()),
            cpu_limit: None,
            memory_limit: Some("32Mi".into()),
        }
    }
}

/// The least memory limit drafs runs in (docs/deploy.md).
pub const MEMORY_FLOOR: &str = "32Mi";

const KEYS: [&str; 4] = ["cpu-request", "memory-request", "cpu-limit", "memory-limit"];

impl Resources {
    /// The container's `resources`.
    pub fn to_json(&self) -> Value {
        let section = |cpu: &Option<String>, memory: &Option<String>| {
            let mut m = Map::new();
            for (name, value) in [("cpu", cpu), ("memory", memory)] {
                if let Some(v) = value {
                    m.insert(name.into(), json!(v));
                }
            }
            m
        };
        let mut out = Map::new();
        for (name, section) in [
            ("requests", section(&self.cpu_request, &self.memory_request)),
            ("limits", section(&self.cpu_limit, &self.memory_limit)),
        ] {
            if !section.is_empty() {
                out.insert(name.into(), Value::Object(section));
            }
        }
        Value::Object(out)
    }

    fn slot(&mut self, key: &str) -> Option<&mut Option<String>> {
        match key {
            "cpu-request" => Some(&mut self.cpu_request),
            "memory-request" => Some(&mut self.memory_request),
            "cpu-limit" => Some(&mut self.cpu_limit),
            "memory-limit" => Some(&mut self.memory_limit),
            _ => None,
        }
    }

    /// These, with `key=quantity` pairs (comma-separated) over them; an
    /// empty quantity unsets the key.
    pub fn with(&self, text: &str) -> Result<Resources, String> {
        let mut out = self.clone();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| format!("{pair:?} is not KEY=QUANTITY"))?;
            let slot = out.slot(key.trim()).ok_or_else(|| format!("{key:?} is not one of {}", KEYS.join(", ")))?;
            let value = value.trim();
            *slot = if value.is_empty() { None } else { Some(check_quantity(value)?) };
        }
        out.check()?;
        Ok(out)
    }

    /// A request above its limit is refused by the API server, and a memory
    /// limit below [`MEMORY_FLOOR`] ends in an OOM kill: said here.
    pub fn check(&self) -> Result<(), String> {
        if let Some(limit) = &self.memory_limit
            && amount(limit) < amount(MEMORY_FLOOR)
        {
            return Err(format!(
                "the memory limit {limit} is below {MEMORY_FLOOR}: the tree's in-memory volume (12Mi) is charged to drafs's container beside drafs itself"
            ));
        }
        for (what, request, limit) in
            [("cpu", &self.cpu_request, &self.cpu_limit), ("memory", &self.memory_request, &self.memory_limit)]
        {
            if let (Some(r), Some(l)) = (request, limit)
                && amount(r) > amount(l)
            {
                return Err(format!("the {what} request {r} is above its limit {l}"));
            }
        }
        Ok(())
    }
}

/// A Kubernetes quantity (`100m`, `64Mi`, `1.5`, `2e3`), or why not.
pub fn check_quantity(text: &str) -> Result<String, String> {
    let (number, suffix) = split(text);
    let number_ok = !number.is_empty()
        && number.chars().filter(|c| *c == '.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit())
        && number.chars().all(|c| c.is_ascii_digit() || c == '.');
    let suffix_ok = multiplier(suffix).is_some();
    if number_ok && suffix_ok && text.len() <= 64 {
        Ok(text.to_string())
    } else {
        Err(format!("{text:?} is not a quantity (e.g. 100m, 0.5, 64Mi, 1Gi)"))
    }
}

fn split(text: &str) -> (&str, &str) {
    let at = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    text.split_at(at)
}

fn multiplier(suffix: &str) -> Option<f64> {
    let binary = |n: i32| Some(1024f64.powi(n));
    let decimal = |n: i32| Some(10f64.powi(n));
    match suffix {
        "" => Some(1.0),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        e if e.len() > 1 && e.starts_with(['e', 'E']) => {
            e[1..].parse::<i32>().ok().filter(|n| n.abs() <= 18).map(|n| 10f64.powi(n))
        }
        _ => None,
    }
}

/// The amount a checked quantity stands for.
fn amount(text: &str) -> f64 {
    let (number, suffix) = split(text);
    number.parse::<f64>().unwrap_or(0.0) * multiplier(suffix).unwrap_or(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_what_drafs_always_had() {
        assert_eq!(
            Resources::default().to_json(),
            json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}})
        );
    }

    #[test]
    fn pairs_set_and_unset_over_the_defaults() {
        let r = Resources::default().with("cpu-limit=100m, memory-limit=64Mi").unwrap();
        assert_eq!(r.to_json()["limits"], json!({"cpu": "100m", "memory": "64Mi"}));
        let r = Resources::default().with("memory-limit=,cpu-request=").unwrap();
        assert_eq!(r.to_json(), json!({"requests": {"memory": "16Mi"}}));
        assert_eq!(Resources::default().with("").unwrap(), Resources::default());
    }

    #[test]
    fn bad_pairs_say_what_is_wrong() {
        let err = |t: &str| Resources::default().with(t).unwrap_err();
        assert!(err("cpu=1").contains("\"cpu\" is not one of cpu-request"), "{}", err("cpu=1"));
        assert!(err("cpu-limit").contains("not KEY=QUANTITY"));
        assert!(err("cpu-limit=lots").contains("\"lots\" is not a quantity"));
        assert!(err("memory-limit=8Mi").contains("the memory limit 8Mi is below 32Mi"));
        assert!(err("memory-request=64Mi").contains("the memory request 64Mi is above its limit 32Mi"));
        assert!(err("cpu-request=1,cpu-limit=500m").contains("cpu request 1 is above its limit 500m"));
    }

    #[test]
    fn quantities_are_kubernetes_quantities() {
        for fine in ["100m", "0.5", "1", "64Mi", "1Gi", "2e3", "1.5G", ".5"] {
            assert_eq!(check_quantity(fine), Ok(fine.to_string()), "{fine}");
        }
        for bad in ["", "m", "1.2.3", "64MB", "-1", "1 Gi", "1x", "1e", "ten"] {
            assert!(check_quantity(bad).is_err(), "{bad}");
        }
        assert!(amount("1Gi") > amount("1000Mi") && amount("100m") < amount("1"));
    }
}
