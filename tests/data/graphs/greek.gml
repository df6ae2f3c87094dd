graph [
  node [ id 0 label "gamma" ]
  node [ id 1 label "alpha" ]
  node [ id 2 label "beta" ]
  edge [ source 0 target 1 ]
  edge [ source 1 target 2 ]
]
