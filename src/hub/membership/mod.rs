//! Membership (DESIGN.md sections 5 and 6): which member clusters there are and how to
//! reach them (`members`, `credentials`, `tokens`), whether they are healthy (`prober`,
//! `health`, `capacity`), what that means for placement (`taints`, `zones`,
//! `disruption`), and the fencing Lease the hub renews in every reachable member
//! (`lease`), and the fresh positive evidence of each member that stateful deletes need
//! (`evidence`). `tasks` runs one task per member. Federation reads its results through the
//! registry, the health board and the MemberCluster objects.

pub mod capacity;
pub mod credentials;
pub mod disruption;
pub mod evidence;
pub mod health;
pub mod lease;
pub mod members;
pub mod metrics;
pub mod prober;
pub mod taints;
pub mod tasks;
pub mod terms;
pub mod tokens;
pub mod zones;
