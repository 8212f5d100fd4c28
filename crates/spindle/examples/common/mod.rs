//! What the map examples share: a replicated map of `key=value` commands
//! (with snapshot and restore for joiners) and its digest.

use std::collections::BTreeMap;

use spindle::{Delivery, StateMachine, View};

/// The replicated state: an ordered map from key to value.
#[derive(Default)]
pub struct Map {
    pub entries: BTreeMap<String, String>,
    /// Ranks whose last command (`done`) was applied: not replicated
    /// state, just how an example knows everyone stopped putting.
    pub done: Vec<usize>,
    /// Print every view installed.
    pub print_views: bool,
}

impl StateMachine for Map {
    fn apply(&mut self, d: &Delivery<'_>) {
        let text = String::from_utf8_lossy(d.payload);
        if text == "done" {
            self.done.push(d.sender_rank);
        } else if let Some((key, value)) = text.split_once('=') {
            self.entries.insert(key.to_string(), value.to_string());
        }
    }
    fn snapshot(&self, out: &mut Vec<u8>) {
        for (k, v) in &self.entries {
            out.extend_from_slice(format!("{k}={v}\n").as_bytes());
        }
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(snapshot).map_err(|e| format!("snapshot is not UTF-8: {e}"))?;
        self.entries = text
            .lines()
            .map(|line| {
                line.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| format!("bad snapshot line '{line}'"))
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }
    /// A read: the request is a key, the reply its value.
    fn query(&self, request: &[u8], reply: &mut Vec<u8>) -> Result<(), String> {
        let key = String::from_utf8_lossy(request);
        let value = self
            .entries
            .get(key.as_ref())
            .ok_or_else(|| format!("no key {key:?}"))?;
        reply.extend_from_slice(value.as_bytes());
        Ok(())
    }
    fn view_installed(&mut self, view: &View) {
        if self.print_views {
            println!(
                "[pid {}] view {} installed: members {:?} (joined {:?}, departed {:?})",
                std::process::id(),
                view.id,
                view.members,
                view.joined,
                view.departed
            );
        }
    }
}

/// FNV-1a over the map's snapshot: equal maps, equal digests.
pub fn digest(map: &Map) -> u64 {
    let mut out = Vec::new();
    map.snapshot(&mut out);
    out.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
