INSERT INTO sys_dt VALUES (1, '2025-11-12');

INSERT INTO ownr (own_id, fnm, lnm, ph, eml, is_actv) VALUES
 ('O-1043', 'Helen', 'Marsh', '555-0143', 'hmarsh@example.net', 1),
 ('O-1051', 'Raj', 'Iyer', '555-0151', 'raj.iyer@example.net', 1),
 ('O-1066', 'Sofia', 'Brandt', '555-0166', NULL, 1),
 ('O-1072', 'Tom', 'Hale', '555-0172', 'tom.hale@example.net', 1),
 ('O-1080', 'Ines', 'Carvalho', '555-0180', 'ines.c@example.net', 1),
 ('O-1094', 'Kenji', 'Mori', '555-0194', 'kmori@example.net', 1),
 ('O-1101', 'Lena', 'Vogel', '555-0201', NULL, 1),
 ('O-1117', 'Marco', 'Bianchi', '555-0217', 'm.bianchi@example.net', 1),
 ('O-1120', 'Noor', 'Haddad', '555-0220', 'noor.h@example.net', 0);

INSERT INTO pet (pet_id, own_id, nm, spc, brd, sx, dob, wt_kg, is_neut, is_dcsd) VALUES
 ('PT-20931', 'O-1043', 'Biscuit', 'dog', 'beagle', 'M', '2019-04-02', 12.4, 1, 0),
 ('PT-20932', 'O-1043', 'Pepper', 'cat', 'domestic shorthair', 'F', '2025-08-21', 1.6, 0, 0),
 ('PT-21007', 'O-1051', 'Kiwi', 'brd', 'budgerigar', 'M', '2023-02-11', 0.04, 0, 0),
 ('PT-21008', 'O-1051', 'Mango', 'rbt', 'holland lop', 'F', '2022-07-30', 1.8, 1, 0),
 ('PT-21110', 'O-1066', 'Rex', 'dog', 'german shepherd', 'M', '2021-01-15', 34.0, 0, 0),
 ('PT-21150', 'O-1072', 'Luna', 'cat', 'siamese', 'F', '2018-05-05', 4.1, 1, 0),
 ('PT-21151', 'O-1072', 'Milo', 'cat', 'maine coon', 'M', '2025-07-20', NULL, 0, 0),
 ('PT-21203', 'O-1080', 'Spike', 'rpt', 'bearded dragon', 'M', '2020-09-01', 0.45, 0, 0),
 ('PT-21204', 'O-1080', 'Nala', 'dog', 'labrador', 'F', '2011-03-19', 29.5, 1, 1),
 ('PT-21288', 'O-1094', 'Toffee', 'dog', 'cocker spaniel', 'F', '2020-12-01', 13.2, 1, 0),
 ('PT-21340', 'O-1101', 'Oscar', 'cat', 'british shorthair', 'M', '2017-10-10', 5.6, 1, 0),
 ('PT-21399', 'O-1117', 'Bella', 'dog', 'border collie', 'F', '2022-04-04', 18.9, 0, 0),
 ('PT-21420', 'O-1120', 'Sultan', 'cat', 'persian', 'M', '2016-01-01', 4.8, 1, 0);

INSERT INTO vet (vet_id, nm, exo_ok, is_surg, max_dy) VALUES
 ('V-01', 'Dr. Anya Kovacs', 0, 1, 6),
 ('V-02', 'Dr. Ben Osei', 1, 0, 4),
 ('V-03', 'Dr. Carla Mendes', 0, 1, 3),
 ('V-04', 'Dr. Dan Whitfield', 1, 1, 5);

INSERT INTO appt (appt_id, pet_id, vet_id, appt_dt, slot, typ, is_emrg, sts, notes) VALUES
 (1, 'PT-20931', 'V-01', '2025-10-02', '09:30', 'wel', 0, 'done', 'annual check, rabies booster'),
 (2, 'PT-20932', 'V-01', '2025-10-16', '10:30', 'vax', 0, 'done', 'first kitten shot'),
 (3, 'PT-20931', 'V-01', '2025-11-13', '09:30', 'sick', 0, 'bkd', 'limping, left hind leg'),
 (4, 'PT-21288', 'V-03', '2025-11-03', '14:00', 'wel', 0, 'done', NULL),
 (5, 'PT-21110', 'V-03', '2025-11-13', '08:30', 'sick', 0, 'bkd', 'ear infection'),
 (6, 'PT-21150', 'V-03', '2025-11-13', '10:30', 'fu', 0, 'bkd', NULL),
 (7, 'PT-21399', 'V-03', '2025-11-13', '15:00', 'surg', 0, 'bkd', 'spay'),
 (8, 'PT-21007', 'V-02', '2025-11-14', '09:30', 'wel', 0, 'bkd', 'beak and nail trim'),
 (9, 'PT-21203', 'V-02', '2025-11-14', '11:30', 'sick', 0, 'bkd', 'not eating'),
 (10, 'PT-21340', 'V-02', '2025-11-14', '16:00', 'vax', 0, 'bkd', NULL),
 (11, 'PT-21110', 'V-01', '2025-09-18', '11:30', 'surg', 0, 'done', 'cruciate ligament repair'),
 (12, 'PT-21110', 'V-03', '2025-10-28', '08:30', 'sick', 0, 'nos', NULL),
 (13, 'PT-21150', 'V-01', '2025-10-20', '14:00', 'sick', 0, 'done', 'dental abscess'),
 (14, 'PT-21151', 'V-04', '2025-11-10', '15:00', 'wel', 0, 'cxl', NULL),
 (15, 'PT-21399', 'V-01', '2025-10-30', '10:30', 'sick', 1, 'done', 'ate chocolate'),
 (16, 'PT-21204', 'V-01', '2025-08-11', '16:00', 'sick', 1, 'done', NULL),
 (17, 'PT-21288', 'V-04', '2025-11-12', '16:00', 'vax', 0, 'bkd', 'rabies booster'),
 (18, 'PT-21008', 'V-02', '2025-11-20', '10:30', 'wel', 0, 'bkd', NULL),
 (19, 'PT-20932', 'V-01', '2025-11-12', '14:00', 'vax', 0, 'bkd', 'second kitten shot'),
 (20, 'PT-21340', 'V-01', '2025-11-05', '09:30', 'wel', 0, 'done', NULL),
 (21, 'PT-21420', 'V-02', '2025-06-03', '10:30', 'wel', 0, 'done', NULL),
 (22, 'PT-20931', 'V-04', '2025-11-26', '17:00', 'fu', 0, 'bkd', NULL),
 (23, 'PT-21151', 'V-04', '2025-10-24', '11:30', 'sick', 0, 'done', 'diarrhoea');

INSERT INTO vax (pet_id, vax_cd, adm_dt, lot_no, nxt_due) VALUES
 ('PT-20931', 'DHPP', '2023-04-10', 'DH-1187', '2026-04-10'),
 ('PT-20931', 'RAB', '2024-10-02', 'RB-2291', '2025-10-02'),
 ('PT-20931', 'RAB', '2025-10-02', 'RB-3310', '2026-10-02'),
 ('PT-20932', 'FVRCP', '2025-10-16', 'FV-0412', '2025-11-13'),
 ('PT-21008', 'RHD', '2025-05-05', 'RH-0077', '2026-05-05'),
 ('PT-21110', 'RAB', '2025-03-14', 'RB-2950', '2026-03-14'),
 ('PT-21110', 'LEPT', '2025-03-14', 'LP-1402', '2026-03-14'),
 ('PT-21150', 'FVRCP', '2024-09-09', 'FV-0233', '2025-09-09'),
 ('PT-21288', 'RAB', '2024-12-20', 'RB-2702', '2025-12-20'),
 ('PT-21340', 'RAB', '2024-12-17', 'RB-2698', '2025-12-17'),
 ('PT-21399', 'DHPP', '2024-11-01', 'DH-1530', '2027-11-01');

INSERT INTO inv (inv_no, own_id, appt_id, amt, iss_dt, sts) VALUES
 ('INV-25-0540', 'O-1120', 21, 60.00, '2025-06-03', 'void'),
 ('INV-25-0612', 'O-1080', 16, 420.00, '2025-08-11', 'pd'),
 ('INV-25-0690', 'O-1066', 11, 300.00, '2025-09-18', 'opn'),
 ('INV-25-0701', 'O-1043', 1, 65.00, '2025-10-02', 'pd'),
 ('INV-25-0733', 'O-1043', 2, 48.00, '2025-10-16', 'pd'),
 ('INV-25-0745', 'O-1072', 13, 180.00, '2025-10-20', 'opn'),
 ('INV-25-0751', 'O-1072', 23, 100.00, '2025-10-24', 'opn'),
 ('INV-NS-12', 'O-1066', 12, 35.00, '2025-10-28', 'opn'),
 ('INV-25-0764', 'O-1117', 15, 200.00, '2025-10-30', 'opn'),
 ('INV-25-0779', 'O-1094', 4, 70.00, '2025-11-03', 'pd'),
 ('INV-25-0780', 'O-1101', 20, 55.00, '2025-11-05', 'opn');

INSERT INTO pmt (pmt_id, inv_no, amt, mthd, pd_dt) VALUES
 (1, 'INV-25-0612', 120.00, 'card', '2025-08-11'),
 (2, 'INV-25-0612', 300.00, 'ins', '2025-08-20'),
 (3, 'INV-25-0690', 75.00, 'card', '2025-09-18'),
 (4, 'INV-25-0701', 65.00, 'card', '2025-10-02'),
 (5, 'INV-25-0733', 48.00, 'card', '2025-10-16'),
 (6, 'INV-25-0745', 30.00, 'cash', '2025-10-20'),
 (7, 'INV-25-0779', 70.00, 'cash', '2025-11-03'),
 (8, 'INV-25-0764', 150.00, 'ins', '2025-11-04');
