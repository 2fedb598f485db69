//! Inputs in the shapes of Cilium's and MetalLB's documentation, in IPv4 and IPv6: what the
//! converters' tests convert, and what `ipamctl`'s tests read back after rendering.

/// Cilium's LB-IPAM, L2 announcements and pod IP pools.
pub const CILIUM: &str = r#"
apiVersion: "cilium.io/v2alpha1"
kind: CiliumLoadBalancerIPPool
metadata:
  name: "blue-pool"
spec:
  blocks:
  - cidr: "10.0.10.0/24"
  - cidr: "2004::0/64"
  - start: "20.0.20.100"
    stop: "20.0.20.200"
  - start: "1.2.3.4"
---
apiVersion: "cilium.io/v2alpha1"
kind: CiliumLoadBalancerIPPool
metadata:
  name: "red-pool"
spec:
  allowFirstLastIPs: "No"
  disabled: true
  cidrs:
  - cidr: "fd00:20::/120"
  serviceSelector:
    matchExpressions:
      - {key: color, operator: In, values: [red]}
---
apiVersion: cilium.io/v2alpha1
kind: CiliumL2AnnouncementPolicy
metadata:
  name: policy1
spec:
  serviceSelector:
    matchLabels:
      color: blue
  nodeSelector:
    matchExpressions:
      - key: node-role.kubernetes.io/control-plane
        operator: DoesNotExist
  interfaces:
  - ^eth[0-9]+
  externalIPs: true
  loadBalancerIPs: true
---
apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata:
  name: green-pool
spec:
  ipv4:
    cidrs: [10.20.0.0/16]
    maskSize: 27
  ipv6:
    cidrs: ["fd00:20::/104"]
    maskSize: 120
"#;

/// MetalLB's address pools, L2 and BGP advertisements, peers, BFD profiles and communities.
pub const METALLB: &str = r#"
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: first-pool
  namespace: metallb-system
  labels: {zone: east}
spec:
  addresses:
  - 192.168.10.0/24
  - 192.168.9.1-192.168.9.5
  - fc00:f853:0ccd:e799::/124
  - fc00:f853:0ccd:e800::10 - fc00:f853:0ccd:e800::20
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: expensive
  namespace: metallb-system
spec:
  addresses: [203.0.113.0/28]
  autoAssign: false
  avoidBuggyIPs: true
  serviceAllocation:
    priority: 50
    namespaces: [shop, pay]
    namespaceSelectors:
      - matchLabels: {tier: gold}
    serviceSelectors:
      - matchExpressions:
          - {key: app, operator: In, values: [web]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata:
  name: east
  namespace: metallb-system
spec:
  ipAddressPoolSelectors:
    - matchLabels: {zone: east}
  nodeSelectors:
    - matchLabels: {kubernetes.io/hostname: node-a}
    - matchLabels: {kubernetes.io/hostname: node-b}
  interfaces: [eth0, bond0.100]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata:
  name: everywhere
  namespace: metallb-system
---
apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata:
  name: router
  namespace: metallb-system
spec:
  myASN: 64500
  peerASN: 64501
  peerAddress: 10.0.0.1
  holdTime: 9s
  password: s3cret
  bfdProfile: fast
  enableGracefulRestart: true
  sourceAddress: 10.0.0.2
  nodeSelectors: [{matchLabels: {rack: a}}]
---
apiVersion: metallb.io/v1beta1
kind: BFDProfile
metadata: {name: fast, namespace: metallb-system}
spec: {receiveInterval: 100, transmitInterval: 150, detectMultiplier: 5}
---
apiVersion: metallb.io/v1beta1
kind: Community
metadata: {name: communities, namespace: metallb-system}
spec: {communities: [{name: blackhole-ish, value: "64500:666"}, {name: big, value: "large:4200000000:1:2"}]}
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {name: public, namespace: metallb-system}
spec:
  ipAddressPools: [first-pool]
  communities: [blackhole-ish, "64500:1", big]
  localPref: 200
  peers: [router]
  aggregationLength: 24
"#;

/// Cilium's BGP control plane in the shapes of its documentation: a cluster config with an
/// IPv4 and an IPv6 peer sharing one peer config, whose families select advertisements by label.
pub const CILIUM_BGP: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumBGPClusterConfig
metadata:
  name: cilium-bgp
spec:
  nodeSelector:
    matchLabels:
      rack: rack0
  bgpInstances:
  - name: "instance-65000"
    localASN: 65000
    localPort: 179
    peers:
    - name: "peer-65000-tor1"
      peerASN: 65001
      peerAddress: 10.0.0.1
      peerConfigRef:
        name: "cilium-peer"
    - name: "peer-65000-tor2"
      peerASN: 65001
      peerAddress: fd00:11:0:0::1
      peerConfigRef:
        name: "cilium-peer"
    - name: "peer-lonely"
      peerASN: 65002
      peerAddress: 10.0.0.2
---
apiVersion: cilium.io/v2
kind: CiliumBGPPeerConfig
metadata:
  name: cilium-peer
spec:
  timers:
    holdTimeSeconds: 9
    keepAliveTimeSeconds: 3
  authSecretRef: bgp-auth-secret
  ebgpMultihop: 4
  gracefulRestart:
    enabled: true
    restartTimeSeconds: 15
  transport:
    peerPort: 1179
  families:
    - afi: ipv4
      safi: unicast
      advertisements:
        matchLabels:
          advertise: "bgp"
    - afi: ipv6
      safi: unicast
      advertisements:
        matchLabels:
          advertise: "bgp"
---
apiVersion: cilium.io/v2
kind: CiliumBGPAdvertisement
metadata:
  name: bgp-advertisements
  labels:
    advertise: bgp
spec:
  advertisements:
    - advertisementType: "PodCIDR"
    - advertisementType: "Service"
      service:
        addresses:
          - ClusterIP
          - ExternalIP
          - LoadBalancerIP
      selector:
        matchExpressions:
          - { key: bgp, operator: In, values: [ blue ] }
      attributes:
        communities:
          standard: [ "65000:99", 4259840100 ]
          wellKnown: [ "no-export" ]
          large: [ "1111:1111:1111" ]
        localPreference: 99
    - advertisementType: "Service"
      service:
        addresses: [ LoadBalancerIP ]
---
apiVersion: cilium.io/v2
kind: CiliumBGPAdvertisement
metadata:
  name: unselected
  labels:
    advertise: elsewhere
spec:
  advertisements:
    - advertisementType: "Service"
      service:
        addresses: [ LoadBalancerIP ]
      selector: {}
"#;
