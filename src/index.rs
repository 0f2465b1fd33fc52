//! Caches indexed per namespace, so that looking at one StatefulSet costs what that set has and
//! not what the cluster has.
//!
//! An [`Index`] is fed by one watcher's events (see [`Index::apply`]) and answers: one object by
//! name; the objects of a namespace whose names start with a prefix (a set's pods `web-`, its
//! claims `data-web-`); the objects of a namespace carrying a secondary key (the pods that mount a
//! claim); a whole namespace. Lookups take a read lock for the length of a map lookup, never across
//! an await or an API call, and copy only the `Arc`s they return.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use kube::Resource;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

/// Extra keys an object is found by within its namespace (besides its name).
pub trait Keys {
    /// The keys of this object (default: none).
    fn keys(&self) -> Vec<String> {
        Vec::new()
    }
}

type Names<K> = BTreeMap<String, Arc<K>>;

struct Inner<K> {
    objects: HashMap<String, Names<K>>,
    /// (namespace, key) -> names of the objects with that key.
    keyed: HashMap<(String, String), BTreeSet<String>>,
    /// Objects of a relist, swapped in at its end.
    relist: Option<Vec<Arc<K>>>,
}

impl<K> Default for Inner<K> {
    fn default() -> Self {
        Inner {
            objects: HashMap::new(),
            keyed: HashMap::new(),
            relist: None,
        }
    }
}

/// A cache of one kind of object, indexed by namespace, name and [`Keys`].
pub struct Index<K> {
    inner: Arc<RwLock<Inner<K>>>,
    ready: watch::Sender<bool>,
}

impl<K> Clone for Index<K> {
    fn clone(&self) -> Self {
        Index {
            inner: self.inner.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Index {
            inner: Arc::default(),
            ready: watch::Sender::new(false),
        }
    }
}

fn ns_name<K: Resource>(obj: &K) -> Option<(String, String)> {
    let meta = obj.meta();
    Some((
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone()?,
    ))
}

impl<K: Resource + Keys> Inner<K> {
    fn insert(&mut self, obj: Arc<K>) {
        let Some((ns, name)) = ns_name(obj.as_ref()) else {
            return;
        };
        self.remove(&ns, &name);
        for key in obj.keys() {
            self.keyed
                .entry((ns.clone(), key))
                .or_default()
                .insert(name.clone());
        }
        self.objects.entry(ns).or_default().insert(name, obj);
    }

    fn remove(&mut self, ns: &str, name: &str) {
        let Some(names) = self.objects.get_mut(ns) else {
            return;
        };
        let Some(old) = names.remove(name) else {
            return;
        };
        if names.is_empty() {
            self.objects.remove(ns);
        }
        for key in old.keys() {
            let entry = (ns.to_string(), key);
            if let Some(set) = self.keyed.get_mut(&entry) {
                set.remove(name);
                if set.is_empty() {
                    self.keyed.remove(&entry);
                }
            }
        }
    }
}

impl<K: Resource + Keys> Index<K> {
    /// Applies one watcher event: objects added, changed or deleted; a relist replaces the
    /// contents at its end, at once (lookups never see half a relist).
    pub fn apply(&self, event: &Event<K>)
    where
        K: Clone,
    {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Apply(obj) => inner.insert(Arc::new(obj.clone())),
            Event::Delete(obj) => {
                if let Some((ns, name)) = ns_name(obj) {
                    inner.remove(&ns, &name);
                }
            }
            Event::Init => inner.relist = Some(Vec::new()),
            Event::InitApply(obj) => {
                if let Some(relist) = inner.relist.as_mut() {
                    relist.push(Arc::new(obj.clone()));
                }
            }
            Event::InitDone => {
                let listed = inner.relist.take().unwrap_or_default();
                drop(inner);
                self.replace(listed);
            }
        }
    }

    /// Adds or replaces one object, held as the `Arc` given (another cache may hold the same one).
    pub fn insert(&self, obj: Arc<K>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.insert(obj);
    }

    /// Replaces every object with `objects` (a relist, complete), and marks the index ready.
    pub fn replace(&self, objects: Vec<Arc<K>>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.objects.clear();
        inner.keyed.clear();
        for obj in objects {
            inner.insert(obj);
        }
        drop(inner);
        self.ready.send_replace(true);
    }

    /// Forgets the object named as `obj` is (namespace and name), as a delete event would.
    pub fn remove<R: Resource>(&self, obj: &R) {
        if let Some((ns, name)) = ns_name(obj) {
            let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
            inner.remove(&ns, &name);
        }
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.read().objects.values().map(|names| names.len()).sum()
    }

    /// Whether the index holds no object.
    pub fn is_empty(&self) -> bool {
        self.read().objects.is_empty()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner<K>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The object `name` of namespace `ns`, if the index holds it.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<K>> {
        self.read().objects.get(ns)?.get(name).cloned()
    }

    /// The objects of `ns` whose names start with `prefix`, by name.
    pub fn prefixed(&self, ns: &str, prefix: &str) -> Vec<Arc<K>> {
        let inner = self.read();
        let Some(names) = inner.objects.get(ns) else {
            return Vec::new();
        };
        names
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(_, obj)| obj.clone())
            .collect()
    }

    /// The objects of `ns` that have `key` among their [`Keys`].
    pub fn keyed(&self, ns: &str, key: &str) -> Vec<Arc<K>> {
        let inner = self.read();
        let (Some(names), Some(objects)) = (
            inner.keyed.get(&(ns.to_string(), key.to_string())),
            inner.objects.get(ns),
        ) else {
            return Vec::new();
        };
        names
            .iter()
            .filter_map(|n| objects.get(n).cloned())
            .collect()
    }

    /// Every object of `ns`.
    pub fn namespace(&self, ns: &str) -> Vec<Arc<K>> {
        self.read()
            .objects
            .get(ns)
            .map(|names| names.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every object (for periodic gauges, not for a pass).
    pub fn all(&self) -> Vec<Arc<K>> {
        self.read()
            .objects
            .values()
            .flat_map(|names| names.values().cloned())
            .collect()
    }

    /// Whether the first full list has arrived.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the first full list has arrived.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives in self, so this only ends with the value set.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    impl Keys for ConfigMap {
        fn keys(&self) -> Vec<String> {
            self.data.iter().flat_map(|d| d.keys().cloned()).collect()
        }
    }

    fn cm(ns: &str, name: &str, keys: &[&str]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            data: Some(
                keys.iter()
                    .map(|k| (k.to_string(), String::new()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn names(objs: &[Arc<ConfigMap>]) -> Vec<String> {
        objs.iter()
            .map(|o| o.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    fn listed(objs: Vec<ConfigMap>) -> Index<ConfigMap> {
        let index = Index::default();
        index.apply(&Event::Init);
        for obj in objs {
            index.apply(&Event::InitApply(obj));
        }
        index.apply(&Event::InitDone);
        index
    }

    #[test]
    fn prefixes_stay_within_a_namespace_and_a_prefix() {
        let index = listed(vec![
            cm("a", "web-0", &[]),
            cm("a", "web-1", &[]),
            cm("a", "web-x-0", &[]),
            cm("a", "wea", &[]),
            cm("a", "wf", &[]),
            cm("b", "web-0", &[]),
        ]);
        assert_eq!(
            names(&index.prefixed("a", "web-")),
            ["web-0", "web-1", "web-x-0"]
        );
        assert_eq!(names(&index.prefixed("b", "web-")), ["web-0"]);
        assert!(index.prefixed("c", "web-").is_empty());
        assert_eq!(names(&index.namespace("a")).len(), 5);
        assert_eq!(index.all().len(), 6);
    }

    #[test]
    fn keys_follow_changes_and_deletes() {
        let index = listed(vec![cm("a", "p", &["data-0"]), cm("a", "q", &["data-0"])]);
        assert_eq!(names(&index.keyed("a", "data-0")), ["p", "q"]);
        index.apply(&Event::Apply(cm("a", "p", &["data-1"])));
        assert_eq!(names(&index.keyed("a", "data-0")), ["q"]);
        assert_eq!(names(&index.keyed("a", "data-1")), ["p"]);
        index.apply(&Event::Delete(cm("a", "q", &["data-0"])));
        assert!(index.keyed("a", "data-0").is_empty());
        assert!(index.keyed("b", "data-1").is_empty());
        assert!(index.get("a", "q").is_none());
        assert!(index.get("a", "p").is_some());
    }

    #[test]
    fn a_relist_replaces_everything_at_its_end() {
        let index = listed(vec![cm("a", "old", &["k"])]);
        assert!(index.is_ready());
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(cm("a", "new", &["k"])));
        // Mid-relist, lookups still see the last complete list.
        assert_eq!(names(&index.namespace("a")), ["old"]);
        index.apply(&Event::InitDone);
        assert_eq!(names(&index.namespace("a")), ["new"]);
        assert_eq!(names(&index.keyed("a", "k")), ["new"]);
    }

    #[tokio::test]
    async fn ready_after_the_first_list_only() {
        let index: Index<ConfigMap> = Index::default();
        assert!(!index.is_ready());
        index.apply(&Event::Init);
        assert!(!index.is_ready());
        index.apply(&Event::InitDone);
        tokio::time::timeout(std::time::Duration::from_secs(1), index.wait_ready())
            .await
            .expect("ready");
    }
}
