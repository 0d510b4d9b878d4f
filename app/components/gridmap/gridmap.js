// Grid map component of the Uncertainty Atlas dashboard (Python side: app/gridmap.py).
//
// Draws one prediction-grid map with deck.gl (vendored deck.min.js): the colour bitmap, region and strata
// outlines, the x_ref marker and, with a network, a raster basemap. No layer is pickable: a click is turned
// into a map coordinate by the viewport (no GPU picking, which software WebGL does slowly and unreliably on
// tens of thousands of cells), the cell under it is read from the grid's pixel -> cell index (a PNG), and
// {cell, lon, lat, t} goes back to Streamlit. Hover tooltips use the same index and the cell values sent
// once per run as float32 arrays. Streamlit's component protocol is spoken directly (postMessage), so no
// build step or npm package is needed.
(function () {
  "use strict";
  var mapEl = document.getElementById("map");
  var tipEl = document.getElementById("tip");
  var hintEl = document.getElementById("hint");
  var NO_CELL = 0xffffff;
  var deckgl = null;
  var args = null;
  var viewKey = null;
  var lookup = null; // {key, bounds, yS, yN, w, h, index: Int32Array, ids, vals: {m, lo, hi, w, wt}}
  var lookupKey = null;
  var outlineCache = {};
  var lastHeight = -1;

  function send(type, extra) {
    var msg = { isStreamlitMessage: true, type: type };
    for (var k in extra || {}) msg[k] = extra[k];
    window.parent.postMessage(msg, "*");
  }

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  // app.colors.format_number: 3 significant digits, thousands separators, exponent outside [1e-3, 1e6)
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "\u2013";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2).replace(/e([+-])(\d)$/, "e$10$2");
    if (a < 1000) return String(Number(v.toPrecision(3)));
    return Math.round(v).toLocaleString("en-US");
  }

  function mercY(lat) {
    var phi = (Math.max(Math.min(lat, 85.0511287798066), -85.0511287798066) * Math.PI) / 180;
    return Math.log(Math.tan(Math.PI / 4 + phi / 2));
  }

  function b64bytes(s) {
    var bin = atob(s);
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out.buffer;
  }

  function loadLookup(lk) {
    if (!lk) {
      lookup = null;
      lookupKey = null;
      return;
    }
    if (lk.key === lookupKey) return;
    lookupKey = lk.key;
    var img = new Image();
    img.onload = function () {
      var c = document.createElement("canvas");
      c.width = lk.w;
      c.height = lk.h;
      var ctx = c.getContext("2d", { willReadFrequently: true });
      ctx.drawImage(img, 0, 0);
      var d = ctx.getImageData(0, 0, lk.w, lk.h).data;
      var index = new Int32Array(lk.w * lk.h);
      for (var i = 0; i < index.length; i++) index[i] = (d[4 * i] << 16) | (d[4 * i + 1] << 8) | d[4 * i + 2];
      var vals = {};
      for (var name in lk.vals) vals[name] = new Float32Array(b64bytes(lk.vals[name]));
      if (lookupKey === lk.key) {
        lookup = {
          bounds: lk.bounds, yS: mercY(lk.bounds[1]), yN: mercY(lk.bounds[3]), w: lk.w, h: lk.h,
          index: index, ids: new Int32Array(b64bytes(lk.ids)), vals: vals, units: lk.units, tunits: lk.tunits,
          kind: lk.kind || "grid",
        };
        document.body.setAttribute("data-ready", "1");
      }
    };
    img.src = lk.index_png;
  }

  function cellAt(lon, lat) {
    if (!lookup) return -1;
    var b = lookup.bounds;
    if (lon < b[0] || lon > b[2] || lat < b[1] || lat > b[3]) return -1;
    var col = Math.floor(((lon - b[0]) / (b[2] - b[0])) * lookup.w);
    var row = Math.floor(((lookup.yN - mercY(lat)) / (lookup.yN - lookup.yS)) * lookup.h);
    if (col < 0 || row < 0 || col >= lookup.w || row >= lookup.h) return -1;
    var c = lookup.index[row * lookup.w + col];
    return c === NO_CELL ? -1 : c;
  }

  function coordinateOf(info) {
    if (info && info.coordinate) return info.coordinate;
    if (info && info.viewport && info.x !== undefined) return info.viewport.unproject([info.x, info.y]);
    return null;
  }

  function tooltipHtml(c) {
    var v = lookup.vals;
    var u = lookup.units ? " " + esc(lookup.units) : "";
    if (lookup.kind === "change") {
      return (
        "<b>cell " + esc(lookup.ids[c]) + "</b><br/>change " + fmt(v.m[c]) + u +
        "<br/>95% interval [" + fmt(v.lo[c]) + ", " + fmt(v.hi[c]) + "]" + u +
        "<br/>P(improved) " + fmt(v.p[c])
      );
    }
    return (
      "<b>cell " + esc(lookup.ids[c]) + "</b><br/>mean " + fmt(v.m[c]) + u +
      "<br/>95% interval [" + fmt(v.lo[c]) + ", " + fmt(v.hi[c]) + "]" + u +
      "<br/>width " + fmt(v.w[c]) + u + " (" + fmt(v.wt[c]) + " " + esc(lookup.tunits || "") + ")"
    );
  }

  function onHover(info) {
    var xy = coordinateOf(info);
    var c = xy ? cellAt(xy[0], xy[1]) : -1;
    if (c < 0 || !lookup) {
      tipEl.style.display = "none";
      return;
    }
    tipEl.innerHTML = tooltipHtml(c);
    tipEl.style.display = "block";
    var x = info.x + 14;
    var y = info.y + 14;
    if (x + tipEl.offsetWidth > mapEl.clientWidth) x = Math.max(0, info.x - tipEl.offsetWidth - 10);
    if (y + tipEl.offsetHeight > mapEl.clientHeight) y = Math.max(0, info.y - tipEl.offsetHeight - 10);
    tipEl.style.left = x + "px";
    tipEl.style.top = y + "px";
  }

  function onClick(info) {
    if (!args || !args.clickable) return;
    var xy = coordinateOf(info);
    if (!xy) return;
    var c = cellAt(xy[0], xy[1]);
    if (lookup && c < 0) return; // a click outside the grid (sea, a gap) selects nothing
    send("streamlit:setComponentValue", {
      value: { cell: c, lon: xy[0], lat: xy[1], t: Date.now() },
      dataType: "json",
    });
  }

  function outlineData(text) {
    if (!(text in outlineCache)) outlineCache[text] = JSON.parse(text);
    return outlineCache[text];
  }

  function buildLayers(a) {
    var layers = [];
    if (a.basemap) {
      layers.push(
        new deck.TileLayer({
          id: "basemap",
          data: "https://basemaps.cartocdn.com/light_all/{z}/{x}/{y}.png",
          minZoom: 0, maxZoom: 19, tileSize: 256,
          renderSubLayers: function (props) {
            var bb = props.tile.boundingBox;
            return new deck.BitmapLayer(props, {
              data: null, image: props.data, bounds: [bb[0][0], bb[0][1], bb[1][0], bb[1][1]],
            });
          },
        })
      );
    }
    layers.push(
      new deck.BitmapLayer({
        id: "colour", image: a.image, bounds: a.bounds, pickable: false,
        textureParameters: { minFilter: "nearest", magFilter: "nearest" },
      })
    );
    (a.outlines || []).forEach(function (o, i) {
      layers.push(
        new deck.GeoJsonLayer({
          id: "outline-" + i, data: outlineData(o.geojson), stroked: true, filled: false,
          getLineColor: o.color, lineWidthUnits: "pixels", getLineWidth: o.width, pickable: false,
        })
      );
    });
    if (a.labels && a.labels.length) {  // numbered points (the Decide page's suggested sites)
      layers.push(new deck.ScatterplotLayer({
        id: "labels-dot", data: a.labels, getPosition: function (d) { return d.p; }, radiusUnits: "pixels",
        getRadius: 9, stroked: true, filled: true, getFillColor: [255, 255, 255, 235], getLineColor: [0, 0, 0, 255],
        lineWidthUnits: "pixels", getLineWidth: 1.5, pickable: false,
      }));
      layers.push(new deck.TextLayer({
        id: "labels-text", data: a.labels, getPosition: function (d) { return d.p; }, getText: function (d) { return d.text; },
        getSize: 12, getColor: [0, 0, 0, 255], fontWeight: 700, getTextAnchor: "middle",
        getAlignmentBaseline: "center", pickable: false,
      }));
    }
    if (a.marker) {
      var ring = {
        data: [{ p: a.marker }], getPosition: function (d) { return d.p; }, radiusUnits: "pixels",
        stroked: true, filled: false, lineWidthUnits: "pixels", getRadius: 11, pickable: false,
      };
      layers.push(new deck.ScatterplotLayer(Object.assign({}, ring, { id: "xref-outer", getLineWidth: 4,
        getLineColor: [255, 255, 255, 255] })));
      layers.push(new deck.ScatterplotLayer(Object.assign({}, ring, { id: "xref-inner", getLineWidth: 2,
        getLineColor: [0, 0, 0, 255] })));
    }
    return layers;
  }

  // The initial view fitting a.fit.bounds (W, S, E, N) into the map as it is drawn: the same formula as
  // app/layers.py view_for_bounds, with the iframe's real width instead of the width the page assumed (a
  // narrower column would otherwise crop the region's ends). a.view when there is no fit or no width yet.
  function fits(a) { return !!(a.fit && a.fit.bounds && mapEl.clientWidth > 0); }
  function initialView(a, height) {
    var f = a.fit, w = mapEl.clientWidth;
    if (!fits(a)) return Object.assign({}, a.view);
    var W = f.bounds[0], S = f.bounds[1], E = f.bounds[2], N = f.bounds[3], pad = f.pad || 0;
    var y = function (la) { return Math.log(Math.tan(Math.PI / 4 + (Math.max(Math.min(la, 85), -85) * Math.PI / 180) / 2)); };
    var lat = (2 * Math.atan(Math.exp((y(S) + y(N)) / 2)) - Math.PI / 2) * 180 / Math.PI;
    var zx = Math.log2((360 * w) / (512 * Math.max(E - W, 1e-6) * (1 + 2 * pad)));
    var zy = Math.log2((2 * Math.PI * height) / (512 * Math.max(y(N) - y(S), 1e-8) * (1 + 2 * pad)));
    var zoom = Math.max(0, Math.min(zx, zy, 16));
    return { longitude: (W + E) / 2, latitude: lat, zoom: Math.round(zoom * 100) / 100, pitch: 0, bearing: 0 };
  }

  function render(a) {
    args = a;
    var height = a.height || 460;
    mapEl.style.height = height + "px";
    if (height !== lastHeight) {
      lastHeight = height;
      send("streamlit:setFrameHeight", { height: height });
    }
    hintEl.textContent = a.hint || "";
    hintEl.style.display = a.hint ? "block" : "none";
    loadLookup(a.lookup);
    var layers = buildLayers(a);
    var view = null;
    if (!deckgl) {
      view = initialView(a, height);
      deckgl = new deck.Deck({
        parent: mapEl, width: "100%", height: height, initialViewState: view, controller: true,
        layers: layers, onHover: onHover, onClick: onClick,
        getCursor: function (s) { return s.isDragging ? "grabbing" : a.clickable ? "crosshair" : "grab"; },
      });
      viewKey = a.view_key;
    } else {
      var props = { layers: layers, height: height };
      if (a.view_key !== viewKey) {
        props.initialViewState = view = initialView(a, height);
        viewKey = a.view_key;
      }
      deckgl.setProps(props);
    }
    if (view) {  // what the first view was: tests read it
      document.body.setAttribute("data-view", JSON.stringify({
        zoom: view.zoom, fitted: fits(a), width: mapEl.clientWidth, height: height,
        bounds: a.fit ? a.fit.bounds : null, pad: a.fit ? a.fit.pad : null }));
    }
    document.body.setAttribute("data-rendered", String(Date.now()));
  }

  window.addEventListener("message", function (ev) {
    var d = ev.data;
    if (d && d.type === "streamlit:render") render(d.args || {});
  });
  mapEl.addEventListener("mouseleave", function () { tipEl.style.display = "none"; });
  send("streamlit:componentReady", { apiVersion: 1 });
})();
