//! The registry: policy (family) names to the factories that build a pool's policy.

use std::collections::BTreeMap;

use crate::{Device, Policy, PolicyError, PoolConfig};

/// Builds the policy of one pool from its config and its devices.
pub type PolicyFactory = fn(&PoolConfig, Vec<Device>) -> Result<Box<dyn Policy>, PolicyError>;

/// Maps policy names to factories. Built-ins and author policies register the same way.
#[derive(Clone, Default)]
pub struct Registry {
    factories: BTreeMap<String, PolicyFactory>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The names of the built-in policies, the ones [`Registry::with_builtins`] registers.
    pub const BUILTINS: [&'static str; 3] = ["exclusive", "shared", "sliced"];

    /// A registry with the built-ins: `exclusive`, `shared` and `sliced`.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        r.register("exclusive", crate::exclusive::exclusive);
        r.register("shared", crate::shared::shared);
        r.register("sliced", crate::sliced::sliced);
        r
    }

    /// Registers `factory` under `name`, replacing any earlier one.
    pub fn register(&mut self, name: &str, factory: PolicyFactory) {
        self.factories.insert(name.to_string(), factory);
    }

    /// The factory registered under `name`.
    pub fn get(&self, name: &str) -> Option<PolicyFactory> {
        self.factories.get(name).copied()
    }

    /// Registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Registered names that are not built-ins, sorted: what a custom build adds.
    pub fn extra_names(&self) -> impl Iterator<Item = &str> {
        self.names().filter(|n| !Self::BUILTINS.contains(n))
    }

    /// Builds the policy for `pool` over `devices`.
    pub fn build(
        &self,
        pool: &PoolConfig,
        devices: Vec<Device>,
    ) -> Result<Box<dyn Policy>, PolicyError> {
        let kind = pool.family.kind();
        let factory = self
            .get(kind.name())
            .ok_or_else(|| PolicyError::UnknownPolicy {
                pool: pool.name.clone(),
                policy: kind.name().to_string(),
                registered: self.names().map(str::to_string).collect(),
            })?;
        factory(pool, devices)
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}
