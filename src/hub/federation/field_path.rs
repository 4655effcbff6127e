//! Dotted field paths, as `ResourceInterpreter`s write them (docs/interpreters.md):
//! `.spec.replicas`, `.metadata.labels['app.kubernetes.io/name']`, `.spec.ports[].nodePort`.
//! One parser for every path the hub reads from a user: the interpreter's replica, status,
//! pod-template and member-owned paths, and the reference fields dependencies follow.

use std::fmt;

use serde_json::{Map, Value};

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    Field(String),
    /// `[]`: every element of a list.
    Each,
}

/// A dotted field path from an object's root: `.spec.replicas`,
/// `.metadata.labels['app.kubernetes.io/name']`, `.spec.ports[].nodePort`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldPath {
    text: String,
    segments: Vec<Segment>,
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FieldPath {
    /// Parses a path, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<FieldPath, String> {
        let mut segments = vec![];
        let mut rest = text;
        if !rest.starts_with('.') {
            return Err(format!(
                "`{text}` must start with `.` (a dotted path such as `.spec.replicas`)"
            ));
        }
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("[]") {
                segments.push(Segment::Each);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("['") {
                let Some(end) = after.find("']") else {
                    return Err(format!("`{text}`: `['` without its closing `']`"));
                };
                let key = &after[..end];
                if key.is_empty() {
                    return Err(format!("`{text}`: an empty key in `['']`"));
                }
                segments.push(Segment::Field(key.to_string()));
                rest = &after[end + 2..];
            } else if let Some(after) = rest.strip_prefix('.') {
                let end = after.find(['.', '[']).unwrap_or(after.len());
                let name = &after[..end];
                if name.is_empty() {
                    return Err(format!("`{text}`: an empty field name"));
                }
                if !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$')
                {
                    return Err(format!(
                        "`{text}`: `{name}` is not a plain field name (quote keys with other characters as ['key'])"
                    ));
                }
                segments.push(Segment::Field(name.to_string()));
                rest = &after[end..];
            } else {
                return Err(format!(
                    "`{text}`: unexpected `{rest}` (use `.field`, `['key']` or `[]`; filters and indexes are not supported)"
                ));
            }
        }
        if segments.is_empty() {
            return Err(format!("`{text}` names no field"));
        }
        Ok(FieldPath {
            text: text.to_string(),
            segments,
        })
    }

    /// The steps of the path.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The first field (`spec`, `status`, `metadata`, ...).
    pub fn root(&self) -> &str {
        match &self.segments[0] {
            Segment::Field(name) => name,
            Segment::Each => "",
        }
    }

    /// Whether a segment is `[]` (the path names every element of a list).
    pub fn has_each(&self) -> bool {
        self.segments.contains(&Segment::Each)
    }

    /// The path as a JSON pointer (RFC 6901), e.g. `/spec/replicas`; None with `[]`.
    pub fn pointer(&self) -> Option<String> {
        let mut out = String::new();
        for segment in &self.segments {
            let Segment::Field(name) = segment else {
                return None;
            };
            out.push('/');
            out.push_str(&name.replace('~', "~0").replace('/', "~1"));
        }
        Some(out)
    }

    /// The value at the path (paths with `[]` name no single value).
    pub fn get<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        let mut at = value;
        for segment in &self.segments {
            match segment {
                Segment::Field(name) => at = at.get(name)?,
                Segment::Each => return None,
            }
        }
        Some(at)
    }

    /// Every value the path leads to: one at most without `[]`, one per list element for
    /// each `[]`. None when a field is missing or null, or a `[]` meets something that is
    /// not a list.
    pub fn values<'a>(&self, value: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![value];
        for segment in &self.segments {
            current = current
                .into_iter()
                .flat_map(|at| -> Vec<&'a Value> {
                    match segment {
                        Segment::Field(name) => at.get(name).into_iter().collect(),
                        Segment::Each => at
                            .as_array()
                            .map(|items| items.iter().collect())
                            .unwrap_or_default(),
                    }
                })
                .filter(|v| !v.is_null())
                .collect();
        }
        current
    }

    /// Sets the value at the path, creating the objects on the way.
    pub fn set(&self, value: &mut Value, content: Value) {
        let mut at = value;
        for segment in &self.segments {
            let Segment::Field(name) = segment else {
                return;
            };
            if !at.is_object() {
                *at = Value::Object(Map::new());
            }
            at = at
                .as_object_mut()
                .expect("an object")
                .entry(name.clone())
                .or_insert(Value::Null);
        }
        *at = content;
    }

    /// Removes the field at the path (at every element for `[]`).
    pub fn remove(&self, value: &mut Value) {
        remove_at(value, &self.segments);
    }
}

fn remove_at(value: &mut Value, segments: &[Segment]) {
    match segments {
        [] => {}
        [Segment::Field(name)] => {
            if let Some(map) = value.as_object_mut() {
                map.remove(name);
            }
        }
        [Segment::Field(name), rest @ ..] => {
            if let Some(next) = value.get_mut(name) {
                remove_at(next, rest);
            }
        }
        [Segment::Each, rest @ ..] => {
            if let Some(items) = value.as_array_mut() {
                for item in items {
                    if rest.is_empty() {
                        continue;
                    }
                    remove_at(item, rest);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_parse_and_name_what_is_wrong() {
        let path = FieldPath::parse(".metadata.labels['app.kubernetes.io/name']").unwrap();
        let object = json!({"metadata": {"labels": {"app.kubernetes.io/name": "web"}}});
        assert_eq!(path.get(&object), Some(&json!("web")));
        for (bad, says) in [
            ("spec.replicas", "must start with `.`"),
            (".spec..replicas", "empty field name"),
            (".spec.items[0]", "unexpected `[0]`"),
            (".spec['x", "closing"),
            (".spec.a b", "not a plain field name"),
            (".", "empty field name"),
        ] {
            let error = FieldPath::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn values_walk_every_list_element() {
        let path = FieldPath::parse(".spec.secrets[].name").unwrap();
        let object = json!({"spec": {"secrets": [{"name": "a"}, {"other": 1}, {"name": "b"}]}});
        assert_eq!(path.values(&object), [&json!("a"), &json!("b")]);
        assert_eq!(path.to_string(), ".spec.secrets[].name");
        // `[]` on something that is not a list, and missing or null fields, lead nowhere.
        assert!(
            path.values(&json!({"spec": {"secrets": {"name": "a"}}}))
                .is_empty()
        );
        assert!(path.values(&json!({"spec": null})).is_empty());
        let plain = FieldPath::parse(".spec.configRef").unwrap();
        assert_eq!(
            plain.values(&json!({"spec": {"configRef": {"name": "c"}}})),
            [&json!({"name": "c"})]
        );
        assert_eq!(
            plain.get(&json!({"spec": {"configRef": 1}})),
            Some(&json!(1))
        );
    }

    #[test]
    fn paths_are_json_pointers_too() {
        let path = FieldPath::parse(".metadata.labels['a/b~c']").unwrap();
        assert_eq!(path.pointer().as_deref(), Some("/metadata/labels/a~1b~0c"));
        assert_eq!(FieldPath::parse(".spec.ports[].x").unwrap().pointer(), None);
    }

    #[test]
    fn set_and_remove_follow_the_path() {
        let mut object =
            json!({"spec": {"ports": [{"port": 80, "nodePort": 30000}, {"port": 81}]}});
        FieldPath::parse(".spec.ports[].nodePort")
            .unwrap()
            .remove(&mut object);
        assert_eq!(
            object,
            json!({"spec": {"ports": [{"port": 80}, {"port": 81}]}})
        );
        FieldPath::parse(".spec.size.count")
            .unwrap()
            .set(&mut object, json!(3));
        assert_eq!(object["spec"]["size"]["count"], 3);
        assert_eq!(object["spec"]["ports"][0]["port"], 80, "siblings stay");
    }
}
