"""A replica node's parts: quorum rules, elections, the leader's and follower's sides, peer and client APIs."""
