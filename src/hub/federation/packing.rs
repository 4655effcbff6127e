//! [`Packer`]: JSON texts kept compressed against a dictionary of recent texts of the same
//! kind (LZ4 blocks, the uncompressed size in front).
//!
//! The hub keeps one text per template, binding, template body and member copy. Texts of
//! one kind differ in little but names, UIDs, versions and timestamps, so a dictionary made
//! of a few recent ones takes most of each (a 1.1 KB template text packs to about 150 bytes;
//! packing takes about 2 us and unpacking 0.3 us). The dictionary is renewed from the
//! texts seen last once as many texts have been packed as were held at its last renewal
//! (and after the first 16), and everything held is packed again with it then: the cost
//! is a constant per text packed, and the dictionary follows what the texts look like now
//! (statuses written since, say).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// How many recent texts make the dictionary.
const DICTIONARY_TEXTS: usize = 4;
/// The dictionary's largest size (LZ4 reaches back 64 KB).
const DICTIONARY_BYTES: usize = 16 * 1024;
/// Texts packed before the first dictionary.
const FIRST_RENEWAL: usize = 16;

/// A packed text.
pub type Packed = Box<[u8]>;

#[derive(Default)]
pub struct Packer {
    dictionary: Arc<[u8]>,
    recent: VecDeque<Vec<u8>>,
    /// Texts packed since the dictionary was renewed.
    since_renewal: usize,
    /// Texts held when it was renewed.
    held_at_renewal: usize,
}

impl Packer {
    /// Packs `text` with the current dictionary. Call [`Packer::due`] after storing it.
    pub fn pack(&mut self, text: &[u8]) -> Packed {
        // The oldest recent text's buffer is reused for the newest.
        let mut kept = if self.recent.len() == DICTIONARY_TEXTS {
            self.recent.pop_front().unwrap_or_default()
        } else {
            Vec::new()
        };
        kept.clear();
        kept.extend_from_slice(text);
        self.recent.push_back(kept);
        self.since_renewal += 1;
        lz4_flex::block::compress_prepend_size_with_dict(text, &self.dictionary).into_boxed_slice()
    }

    /// The text `packed` holds (None only if it was not packed by this packer, which is a
    /// bug: the caller logs it).
    pub fn unpack(&self, packed: &[u8]) -> Option<String> {
        unpack_with(&self.dictionary, packed)
    }

    /// The dictionary texts are packed with now: with [`unpack_with`], texts taken from a
    /// store under its lock are read after it is released (a renewal meanwhile does not
    /// change them).
    pub fn dictionary(&self) -> Arc<[u8]> {
        self.dictionary.clone()
    }

    /// Whether the dictionary should be renewed (after a text was packed and stored).
    pub fn due(&self) -> bool {
        self.since_renewal >= self.held_at_renewal.max(FIRST_RENEWAL)
    }

    /// Renews the dictionary from the recent texts and packs every text in `held` again
    /// with it. Returns how many could not be unpacked (not expected): they are dropped,
    /// and the caller says so.
    pub fn renew<K: Eq + std::hash::Hash>(
        &mut self,
        held: &mut [&mut HashMap<K, Packed>],
    ) -> usize {
        let mut dictionary = Vec::new();
        for text in self.recent.iter().rev() {
            if dictionary.len() + text.len() > DICTIONARY_BYTES {
                break;
            }
            dictionary.extend_from_slice(text);
        }
        let (mut count, mut dropped) = (0, 0);
        for map in held.iter_mut() {
            map.retain(|_, packed| {
                let Some(text) = self.unpack(packed) else {
                    dropped += 1;
                    return false;
                };
                *packed =
                    lz4_flex::block::compress_prepend_size_with_dict(text.as_bytes(), &dictionary)
                        .into_boxed_slice();
                true
            });
            count += map.len();
            map.shrink_to_fit();
        }
        self.dictionary = Arc::from(dictionary);
        self.since_renewal = 0;
        self.held_at_renewal = count;
        dropped
    }
}

/// The text `packed` holds, packed with `dictionary`.
pub fn unpack_with(dictionary: &[u8], packed: &[u8]) -> Option<String> {
    let bytes = lz4_flex::block::decompress_size_prepended_with_dict(packed, dictionary).ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(i: usize) -> String {
        format!(
            r#"{{"metadata":{{"name":"web-{i:05}","namespace":"shop","uid":"{i:08x}-1f2e-4d3c-9b8a-{:012x}","resourceVersion":"{}"}},"spec":{{"replicas":6}},"status":{{"readyReplicas":{}}}}}"#,
            i * 7919,
            1000 + i,
            i % 7
        )
    }

    #[test]
    fn packed_texts_read_back_the_same_before_and_after_the_dictionary_is_renewed() {
        let mut packer = Packer::default();
        let mut held: HashMap<usize, Packed> = HashMap::new();
        let mut renewals = 0;
        for i in 0..200 {
            let packed = packer.pack(text(i).as_bytes());
            held.insert(i, packed);
            if packer.due() {
                assert_eq!(packer.renew(&mut [&mut held]), 0);
                renewals += 1;
            }
        }
        // Renewed after 16, 32, 64 and 128 texts: a constant cost per text packed.
        assert_eq!(renewals, 4);
        for i in 0..200 {
            assert_eq!(packer.unpack(&held[&i]).as_deref(), Some(text(i).as_str()));
        }
        let packed: usize = held.values().map(|p| p.len()).sum();
        let plain: usize = (0..200).map(|i| text(i).len()).sum();
        assert!(
            packed * 3 < plain,
            "texts alike pack small: {packed} bytes for {plain}"
        );
    }

    #[test]
    fn renewing_packs_every_map_it_is_given_again() {
        let mut packer = Packer::default();
        let mut objects: HashMap<usize, Packed> = HashMap::new();
        let mut relisting: HashMap<usize, Packed> = HashMap::new();
        for i in 0..20 {
            objects.insert(i, packer.pack(text(i).as_bytes()));
        }
        for i in 20..40 {
            relisting.insert(i, packer.pack(text(i).as_bytes()));
        }
        assert!(packer.due());
        packer.renew(&mut [&mut objects, &mut relisting]);
        assert!(!packer.due());
        assert_eq!(packer.unpack(&objects[&3]).unwrap(), text(3));
        assert_eq!(packer.unpack(&relisting[&33]).unwrap(), text(33));
        // Not due again until as many texts were packed as were held.
        for i in 40..79 {
            relisting.insert(i, packer.pack(text(i).as_bytes()));
        }
        assert!(!packer.due());
        relisting.insert(79, packer.pack(text(79).as_bytes()));
        assert!(packer.due());
    }
}
