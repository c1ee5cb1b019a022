"""Membership: the etcd-shaped store behind the cluster map, liveness and elections."""
from .base import Compare, Delete, Event, KeyValue, Membership, MembershipUnavailable, Put, Watch

__all__ = ["Membership", "MembershipUnavailable", "KeyValue", "Compare", "Put", "Delete", "Event", "Watch"]
